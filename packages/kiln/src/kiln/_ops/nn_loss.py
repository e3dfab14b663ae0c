"""nn primitives: loss functions with ``torch.nn.functional`` names, signatures, defaults and errors.

Fused ops (NumPy reference kernel + backward in kiln ops): ``_nll_loss`` (and its backward
``_nll_loss_backward``),
``_binary_cross_entropy`` and ``_binary_cross_entropy_with_logits``. ``cross_entropy`` is
log-softmax (``nn_norm._log_softmax``) + nll (plus a composed smoothing term); the other losses are compositions of kiln ops,
as they are in PyTorch.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import broadcast_pair, scalar_type_name
from kiln._ops.elementwise import _compute_np
from kiln._ops.nn_norm import _log_softmax
from kiln._state import state
from kiln._tensor import Tensor, _numel

__all__ = [
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "cosine_embedding_loss",
    "cross_entropy",
    "ctc_loss",
    "gaussian_nll_loss",
    "hinge_embedding_loss",
    "huber_loss",
    "kl_div",
    "l1_loss",
    "margin_ranking_loss",
    "mse_loss",
    "multi_margin_loss",
    "multilabel_soft_margin_loss",
    "nll_loss",
    "poisson_nll_loss",
    "smooth_l1_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
]


def _kiln():
    import kiln

    return kiln


# ---------------------------------------------------------------------------------------- reduction args


def _legacy_reduction(size_average, reduce, stacklevel: int = 4) -> str:
    """PyTorch's mapping of the deprecated ``size_average``/``reduce`` pair to a reduction (with its warning)."""
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    ret = "none" if not reduce else ("mean" if size_average else "sum")
    warnings.warn(
        f"size_average and reduce args will be deprecated, please use reduction='{ret}' instead.",
        UserWarning,
        stacklevel=stacklevel,
    )
    return ret


def _reduction(reduction, size_average=None, reduce=None) -> str:
    """The effective reduction: legacy args first, then ``reduction`` validated as PyTorch does."""
    if size_average is not None or reduce is not None:
        return _legacy_reduction(size_average, reduce)
    if reduction == "elementwise_mean":
        warnings.warn(
            "reduction='elementwise_mean' is deprecated. Please use reduction='mean' instead.",
            UserWarning,
            stacklevel=3,
        )
        return "mean"
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    return reduction


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _not_differentiable(fn: str, arg: str, t) -> None:
    if isinstance(t, Tensor) and t._requires_grad and state.grad_enabled:
        raise RuntimeError(
            f"The function '{fn}' is not differentiable with respect to argument '{arg}'. "
            "This input cannot have requires_grad True."
        )


def _warn_size(input: Tensor, target: Tensor) -> None:
    if tuple(target._shape) != tuple(input._shape):
        warnings.warn(
            f"Using a target size ({target.shape}) that is different to the input size ({input.shape}). "
            "This will likely lead to incorrect results due to broadcasting. Please ensure they have the same size.",
            UserWarning,
            stacklevel=3,
        )


# ---------------------------------------------------------------------------------------- nll_loss


_TARGET_DTYPES = (dt.int64, dt.uint8)


def _nll_meta(input, target, weight=None, ignore_index=-100, reduction="mean"):
    nd = len(input._shape)
    if nd < 1:
        raise ValueError(f"Expected 1 or more dimensions (got {nd})")
    tnd = len(target._shape)
    if nd != 1 and input._shape[0] != (target._shape[0] if tnd else 0):
        raise ValueError(
            f"Expected input batch_size ({input._shape[0]}) to match target batch_size "
            f"({target._shape[0] if tnd else 0})."
        )
    n_classes = input._shape[0] if nd == 1 else input._shape[1]
    if nd <= 2:
        if tnd > 1:
            raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
        if nd == 1 and tnd == 1 and target._shape[0] != 1:
            raise ValueError(f"For 1D input, 1D target must have size 1, but got target size: {target._shape[0]}")
        kernel = "nll_loss_out_frame"
    elif nd == 4:
        if tnd != 3:
            raise RuntimeError(
                f"only batches of spatial targets supported (3D tensors) but got targets of dimension: {tnd}"
            )
        if target._shape != (input._shape[0],) + input._shape[2:]:
            raise RuntimeError(f"size mismatch (got input: {list(input._shape)} , target: {list(target._shape)}")
        kernel = "nll_loss2d_forward_out_frame"
    else:
        expected = (input._shape[0],) + input._shape[2:]
        if target._shape != expected:
            raise RuntimeError(f"Expected target size {list(expected)}, got {list(target._shape)}")
        kernel = "nll_loss2d_forward_out_frame"
    if target._dtype not in _TARGET_DTYPES:
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got {scalar_type_name(target._dtype)}")
    if weight is not None and (_numel(weight._shape) != n_classes or len(weight._shape) != 1):
        if nd <= 2:
            raise RuntimeError(
                f"weight tensor should be defined either for all {n_classes} classes or no classes but got weight "
                f"tensor of shape: {list(weight._shape)}"
            )
        raise RuntimeError("weight tensor should be defined either for all or no classes")
    if not input._dtype.is_floating_point:
        raise NotImplementedError(f"\"{kernel}\" not implemented for '{scalar_type_name(input._dtype)}'")
    if weight is not None and weight._dtype is not input._dtype:
        raise RuntimeError(
            f"expected scalar type {scalar_type_name(input._dtype)} but found {scalar_type_name(weight._dtype)}"
        )
    _not_differentiable("nll_loss_forward", "weight", weight)
    shape = (() if nd == 1 else target._shape) if reduction == "none" else ()
    return (shape, input._dtype, input._device)


def _nll_rows(x: np.ndarray, t: np.ndarray):
    """(input as (rows, C) with the class dim last, targets as (rows,))."""
    if x.ndim == 1:
        return x.reshape(1, -1), t.reshape(1)
    return np.moveaxis(x, 1, -1).reshape(-1, x.shape[1]), t.reshape(-1)


def _nll_pick(t: np.ndarray, n_classes: int, weight, ignore_index, compute):
    """(safe target indices, per-row weights with 0 where ignored); raises on an out-of-range target."""
    t = t.astype(np.int64)
    keep = t != ignore_index
    bad = keep & ((t < 0) | (t >= n_classes))
    if bad.any():
        raise IndexError(f"Target {int(t[bad][0])} is out of bounds.")
    safe = np.where(keep, t, 0)
    w = weight.astype(compute)[safe] if weight is not None else np.ones(t.shape, compute)
    return safe, np.where(keep, w, np.zeros((), compute))


def _nll_ref(spec, input, target, weight=None, ignore_index=-100, reduction="mean"):
    compute = _compute_np(spec[1])
    x, t = _nll_rows(input.astype(compute, copy=False), target)
    safe, w = _nll_pick(t, x.shape[1], weight, ignore_index, compute)
    picked = x[np.arange(x.shape[0]), safe] if x.shape[0] else np.zeros(0, compute)
    loss = np.where(w != 0, -w * picked, np.zeros((), compute))
    if reduction == "none":
        return loss.reshape(spec[0])
    total = loss.sum(dtype=compute)
    if reduction == "sum":
        return np.asarray(total, compute)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(total / w.sum(dtype=compute), compute)


def _nll_backward(grad, input, target, weight, ignore_index, reduction):
    return _nll_loss_backward(grad, input, target, weight, ignore_index, reduction), None, None


@op(meta=_nll_meta, reference=_nll_ref, backward=_nll_backward, autocast="fp32", grad_fn_name="NllLossBackward0")
def _nll_loss(
    input: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100, reduction: str = "mean"
) -> Tensor:
    """Negative log likelihood of the ``target`` classes in ``input`` (log-probabilities, classes in dim 1)."""


def _nll_bwd_meta(grad, input, target, weight=None, ignore_index=-100, reduction="mean"):
    out_shape = _nll_meta(input, target, weight, ignore_index, reduction)[0]
    if not grad._dtype.is_floating_point:
        raise NotImplementedError(
            f"\"nll_loss_backward_out_frame\" not implemented for '{scalar_type_name(grad._dtype)}'"
        )
    if grad._shape != out_shape:
        raise RuntimeError(
            f"Expected a tensor of dimension {len(out_shape)} and tensor.size[0] == {list(out_shape)} "
            f"but got: dimension {len(grad._shape)} and tensor.size[0] == {list(grad._shape)}"
        )
    return (input._shape, grad._dtype, grad._device)


def _nll_bwd_ref(spec, grad, input, target, weight=None, ignore_index=-100, reduction="mean"):
    compute = _compute_np(spec[1])
    shape = spec[0]
    n_classes = shape[0] if len(shape) == 1 else shape[1]
    t = target.reshape(1) if len(shape) == 1 else target.reshape(-1)
    safe, w = _nll_pick(t, n_classes, weight, ignore_index, compute)
    g = grad.astype(compute, copy=False)
    if reduction == "none":
        scale = -w * g.reshape(-1)
    elif reduction == "sum":
        scale = -w * g
    else:
        with np.errstate(invalid="ignore", divide="ignore"):
            scale = np.where(w != 0, -w * (g / w.sum(dtype=compute)), np.zeros((), compute))
    rows = np.zeros((safe.shape[0], n_classes), compute)
    rows[np.arange(safe.shape[0]), safe] = scale
    if len(shape) == 1:
        return rows.reshape(shape)
    moved = (shape[0],) + shape[2:] + (n_classes,)
    return np.ascontiguousarray(np.moveaxis(rows.reshape(moved), -1, 1))


def _nll_bwd_backward(grad, target, weight, ignore_index, reduction):
    # the map grad_output -> grad_input is linear; its adjoint is nll_loss itself
    return _nll_loss(grad, target, weight, ignore_index, reduction), None, None, None


@op(
    meta=_nll_bwd_meta,
    reference=_nll_bwd_ref,
    backward=_nll_bwd_backward,
    autocast="fp32",
    grad_fn_name="NllLossBackwardBackward0",
)
def _nll_loss_backward(
    grad: Tensor,
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    """Gradient of :func:`_nll_loss` with respect to its input (``input`` gives only the shape)."""


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    """The negative log likelihood loss: ``-weight[t] * input[n, t]`` for log-probabilities ``input`` (N, C, ...)."""
    reduction = _reduction(reduction, size_average, reduce)
    return _nll_loss(input, target, weight, ignore_index, reduction)


# ---------------------------------------------------------------------------------------- cross_entropy


def cross_entropy(
    input,
    target,
    weight=None,
    size_average=None,
    ignore_index=-100,
    reduce=None,
    reduction="mean",
    label_smoothing=0.0,
):
    """Cross entropy between ``input`` logits (N, C, ...) and class indices or class probabilities ``target``."""
    k = _kiln()
    reduction = _reduction(reduction, size_average, reduce)
    if not 0.0 <= label_smoothing <= 1.0:
        raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    class_dim = 0 if len(input._shape) == 1 else 1
    if input._shape == target._shape:
        return _cross_entropy_probs(k, input, target, weight, reduction, label_smoothing, class_dim)
    logp = _log_softmax(input, class_dim)
    nll = _nll_loss(logp, target, weight, ignore_index, reduction)
    if label_smoothing <= 0.0:
        return nll
    n_classes = input._shape[class_dim]
    ignored = k.eq(target, ignore_index)
    if weight is not None:
        wshape = [1] * len(input._shape)
        wshape[class_dim] = n_classes
        smooth = -(logp * weight.view(wshape)).sum(class_dim)
    else:
        smooth = -logp.sum(class_dim)
    smooth = k.where(ignored, 0.0, smooth)
    if reduction == "mean":
        if weight is not None:
            picked = weight[k.where(ignored, 0, target).to(k.int64)]
            denom = k.where(ignored, 0.0, picked).sum()
        else:
            denom = k.logical_not(ignored).sum()
        ret = smooth.sum() / denom
    else:
        ret = _reduce(smooth, reduction)
    return nll * (1 - label_smoothing) + ret * (label_smoothing / n_classes)


def _cross_entropy_probs(k, input, target, weight, reduction, label_smoothing, class_dim):
    if not target._dtype.is_floating_point:
        raise RuntimeError(
            f"Expected floating point type for target with class probabilities, got {scalar_type_name(target._dtype)}"
        )
    n_classes = input._shape[class_dim]
    if weight is not None and (len(weight._shape) != 1 or weight._shape[0] != n_classes):
        raise RuntimeError(
            f"cross_entropy: weight tensor should be defined either for all {n_classes} classes or no classes but "
            f"got weight tensor of shape: {list(weight._shape)}"
        )
    logp = _log_softmax(input, class_dim)
    if label_smoothing > 0.0:
        target = target * (1 - label_smoothing) + label_smoothing / n_classes
    prod = logp * target
    if weight is not None:
        wshape = [1] * len(input._shape)
        wshape[class_dim] = n_classes
        prod = prod * weight.view(wshape)
    if reduction == "mean":
        rows = _numel(input._shape) / n_classes if n_classes else float("nan")
        return -prod.sum() / rows
    if reduction == "sum":
        return -prod.sum()
    return -prod.sum(class_dim)


# ---------------------------------------------------------------------------------------- binary cross entropy


def _bce_meta(input, target, weight=None, reduction="mean"):
    if not input._dtype.is_floating_point:
        raise NotImplementedError(f"\"binary_cross_entropy\" not implemented for '{scalar_type_name(input._dtype)}'")
    if target._dtype is not input._dtype:
        raise RuntimeError(
            f"Found dtype {scalar_type_name(target._dtype)} but expected {scalar_type_name(input._dtype)}"
        )
    if weight is not None:
        broadcast_pair(weight._shape, input._shape)
    _not_differentiable("binary_cross_entropy", "weight", weight)
    return (input._shape if reduction == "none" else (), input._dtype, input._device)


def _bce_ref(spec, input, target, weight=None, reduction="mean"):
    compute = _compute_np(spec[1])
    x = input.astype(compute, copy=False)
    y = target.astype(compute, copy=False)
    if ((x < 0) | (x > 1) | np.isnan(x)).any():
        raise RuntimeError("all elements of input should be between 0 and 1")
    if ((y < 0) | (y > 1) | np.isnan(y)).any():
        raise RuntimeError("all elements of target should be between 0 and 1")
    with np.errstate(divide="ignore"):
        log_x = np.maximum(np.log(x), compute.type(-100))
        log_1mx = np.maximum(np.log1p(-x), compute.type(-100))
    loss = (y - 1) * log_1mx - y * log_x
    if weight is not None:
        loss = loss * weight.astype(compute, copy=False)
    return _np_reduce(loss, reduction, compute)


def _np_reduce(loss: np.ndarray, reduction: str, compute) -> np.ndarray:
    if reduction == "none":
        return loss
    if reduction == "sum":
        return np.asarray(loss.sum(dtype=compute), compute)
    with np.errstate(invalid="ignore"):
        return np.asarray(loss.mean(dtype=compute) if loss.size else compute.type(np.nan), compute)


def _scaled_grad(grad: Tensor, reduction: str, shape: tuple) -> Tensor:
    """The upstream gradient per element: divided by the element count for ``mean``."""
    return grad / _numel(shape) if reduction == "mean" else grad


def _bce_backward(grad, input, target, weight, reduction, needs_input_grad):
    k = _kiln()
    g = _scaled_grad(grad, reduction, input._shape)
    if weight is not None:
        g = g * weight
    gi = gt = None
    if needs_input_grad[0]:
        gi = g * (input - target) / k.clamp_min((1 - input) * input, 1e-12)
    if needs_input_grad[1]:
        gt = g * (k.clamp_min(k.log1p(-input), -100.0) - k.clamp_min(k.log(input), -100.0))
    return gi, gt, None


@op(
    meta=_bce_meta,
    reference=_bce_ref,
    backward=_bce_backward,
    autocast="fp32",
    grad_fn_name="BinaryCrossEntropyBackward0",
)
def _binary_cross_entropy(
    input: Tensor, target: Tensor, weight: Tensor | None = None, reduction: str = "mean"
) -> Tensor:
    """``-w * (t * log(x) + (1 - t) * log(1 - x))`` with the logs clamped at -100."""


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """Binary cross entropy between probabilities ``input`` and ``target`` (same shape), logs clamped at -100."""
    reduction = _reduction(reduction, size_average, reduce)
    if tuple(target._shape) != tuple(input._shape):
        raise ValueError(
            f"Using a target size ({target.shape}) that is different to the input size ({input.shape}) is deprecated. "
            "Please ensure they have the same size."
        )
    if weight is not None:
        weight = weight.expand(_kiln().broadcast_shapes(target._shape, weight._shape))
    return _binary_cross_entropy(input, target, weight, reduction)


def _bcel_meta(input, target, weight=None, pos_weight=None, reduction="mean"):
    if not input._dtype.is_floating_point:
        raise NotImplementedError(f"\"log_sigmoid_cpu\" not implemented for '{scalar_type_name(input._dtype)}'")
    if not target._dtype.is_floating_point:
        raise RuntimeError(
            f"result type {scalar_type_name(input._dtype)} can't be cast to the desired output type "
            f"{scalar_type_name(target._dtype)}"
        )
    shape = broadcast_pair(input._shape, target._shape)
    if pos_weight is not None:
        broadcast_pair(pos_weight._shape, target._shape)
    if weight is not None:
        shape = broadcast_pair(shape, weight._shape)
    _not_differentiable("binary_cross_entropy_with_logits", "weight", weight)
    _not_differentiable("binary_cross_entropy_with_logits", "pos_weight", pos_weight)
    dtype = dt.promote_types(input._dtype, target._dtype)
    return (shape if reduction == "none" else (), dtype, input._device)


def _softplus_neg_np(x: np.ndarray) -> np.ndarray:
    """``log(1 + exp(-x))`` without overflow."""
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(-x, 0)


def _bcel_ref(spec, input, target, weight=None, pos_weight=None, reduction="mean"):
    compute = _compute_np(spec[1])
    x = input.astype(compute, copy=False)
    y = target.astype(compute, copy=False)
    sp = _softplus_neg_np(x)
    if pos_weight is not None:
        sp = sp * ((pos_weight.astype(compute, copy=False) - 1) * y + 1)
    loss = (1 - y) * x + sp
    if weight is not None:
        loss = loss * weight.astype(compute, copy=False)
    return _np_reduce(loss, reduction, compute)


def _softplus_neg(x: Tensor) -> Tensor:
    k = _kiln()
    return k.log1p(k.exp(-k.abs(x))) + k.relu(-x)


def _bcel_backward(grad, input, target, weight, pos_weight, reduction, needs_input_grad):
    k = _kiln()
    g = _scaled_grad(grad, reduction, broadcast_pair(input._shape, target._shape))
    if weight is not None:
        g = g * weight
    gi = gt = None
    if needs_input_grad[0]:
        if pos_weight is None:
            gi = g * (k.sigmoid(input) - target)
        else:
            gi = g * (((pos_weight - 1) * target + 1) * k.sigmoid(input) - pos_weight * target)
    if needs_input_grad[1]:
        gt = -input if pos_weight is None else (pos_weight - 1) * _softplus_neg(input) - input
        gt = g * gt
    return gi, gt, None, None


@op(
    meta=_bcel_meta,
    reference=_bcel_ref,
    backward=_bcel_backward,
    autocast="fp32",
    grad_fn_name="BinaryCrossEntropyWithLogitsBackward0",
)
def _binary_cross_entropy_with_logits(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    pos_weight: Tensor | None = None,
    reduction: str = "mean",
) -> Tensor:
    """``sigmoid`` + binary cross entropy in one numerically stable step (``pos_weight`` scales positives)."""


def binary_cross_entropy_with_logits(
    input, target, weight=None, size_average=None, reduce=None, reduction="mean", pos_weight=None
):
    """Binary cross entropy on logits ``input`` (a stable ``sigmoid`` + BCE); ``pos_weight`` weighs positives."""
    reduction = _reduction(reduction, size_average, reduce)
    if tuple(target._shape) != tuple(input._shape):
        raise ValueError(f"Target size ({target.shape}) must be the same as input size ({input.shape})")
    return _binary_cross_entropy_with_logits(input, target, weight, pos_weight, reduction)


# ---------------------------------------------------------------------------------------- regression losses


def _require_float(name: str, *tensors) -> None:
    d = tensors[0]._dtype
    for t in tensors[1:]:
        d = dt.promote_types(d, t._dtype)
    if not d.is_floating_point:
        raise NotImplementedError(f"\"{name}\" not implemented for '{scalar_type_name(d)}'")


def _broadcast(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """``torch.broadcast_tensors`` for two tensors (views, no copies)."""
    shape = broadcast_pair(a._shape, b._shape)
    return (a if a._shape == shape else a.expand(shape)), (b if b._shape == shape else b.expand(shape))


def _weighted(loss: Tensor, input: Tensor, weight, reduction: str, mean_over_weight: bool) -> Tensor:
    if tuple(weight._shape) != tuple(input._shape):
        raise ValueError("Weights and input must have the same size.")
    loss = loss * weight
    if reduction == "mean":
        return loss.sum() / weight.sum() if mean_over_weight else loss.mean()
    return _reduce(loss, reduction)


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """Mean squared error ``(input - target) ** 2``; ``weight`` (input's shape) makes ``mean`` a weighted mean."""
    _warn_size(input, target)
    if size_average is not None or reduce is not None:
        reduction = _legacy_reduction(size_average, reduce, 3)
    x, y = _broadcast(input, target)
    if weight is not None:
        return _weighted((x - y) ** 2, input, weight, reduction, True)
    reduction = _reduction(reduction)
    _require_float("mse_cpu", input, target)
    return _reduce((x - y) ** 2, reduction)


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """Mean absolute error ``|input - target|``; ``weight`` (input's shape) makes ``mean`` a weighted mean."""
    k = _kiln()
    _warn_size(input, target)
    if size_average is not None or reduce is not None:
        reduction = _legacy_reduction(size_average, reduce, 3)
    x, y = _broadcast(input, target)
    if weight is not None:
        return _weighted(k.abs(x - y), input, weight, reduction, True)
    return _reduce(k.abs(x - y), _reduction(reduction))


def _smooth_l1(k, d: Tensor, beta: float) -> Tensor:
    a = k.abs(d)
    return k.where(a < beta, (d * d) * (0.5 / beta), a - 0.5 * beta)


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    """Smooth L1: ``0.5 * d**2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 * beta`` (``d = input - target``)."""
    k = _kiln()
    _warn_size(input, target)
    if size_average is not None or reduce is not None:
        reduction = _legacy_reduction(size_average, reduce, 3)
    x, y = _broadcast(input, target)
    reduction = _reduction(reduction)
    if beta == 0.0:
        return _reduce(k.abs(x - y), reduction)
    if beta < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    _require_float("smooth_l1_cpu", input, target)
    return _reduce(_smooth_l1(k, x - y, beta), reduction)


def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    """Huber loss: ``0.5 * d**2`` where ``|d| < delta``, else ``delta * (|d| - 0.5 * delta)``."""
    k = _kiln()
    _warn_size(input, target)
    x, y = _broadcast(input, target)
    red = _reduction(reduction)
    if delta <= 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")
    _require_float("huber_cpu", input, target)
    loss = _smooth_l1(k, x - y, delta) * delta
    if weight is not None:
        return _weighted(loss, input, weight, red, False)
    return _reduce(loss, red)


def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    """KL divergence ``target * (log(target) - input)`` for log-probabilities ``input``; ``batchmean`` divides by N."""
    k = _kiln()
    if size_average is not None or reduce is not None:
        red = _legacy_reduction(size_average, reduce, 3)
    else:
        if reduction == "mean":
            warnings.warn(
                "reduction: 'mean' divides the total loss by both the batch size and the support size."
                "'batchmean' divides only by the batch size, and aligns with the KL div math definition."
                "'mean' will be changed to behave the same as 'batchmean' in the next major release.",
                UserWarning,
                stacklevel=2,
            )
        red = "sum" if reduction == "batchmean" else _reduction(reduction)
    if not (input._dtype.is_floating_point or target._dtype.is_floating_point):
        raise RuntimeError("kl_div: Integral inputs not supported.")
    if log_target:
        loss = k.exp(target) * (target - input)
    else:
        zero = k.eq(target, 0)
        loss = k.where(zero, 0.0, target * k.log(k.where(zero, 1.0, target))) - target * input
    out = _reduce(loss, red)
    if reduction == "batchmean" and len(input._shape) != 0:
        out = out / input._shape[0]
    return out


def poisson_nll_loss(
    input, target, log_input=True, full=False, size_average=None, eps=1e-8, reduce=None, reduction="mean"
):
    """Poisson negative log likelihood: ``exp(input) - target * input`` (``log_input``), else ``input - target * log(input + eps)``."""
    k = _kiln()
    if size_average is not None or reduce is not None:
        reduction = _legacy_reduction(size_average, reduce, 3)
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    if log_input:
        loss = k.exp(input) - target * input
    else:
        loss = input - target * k.log(input + eps)
    if full:
        big = k.gt(target, 1)
        t = k.where(big, target, 2.0)
        stirling = t * k.log(t) - t + 0.5 * k.log(2 * math.pi * t)
        loss = loss + k.where(big, stirling, 0.0)
    return _reduce(loss, reduction)


def gaussian_nll_loss(input, target, var, full=False, eps=1e-6, reduction="mean"):
    """Gaussian negative log likelihood ``0.5 * (log(var) + (input - target)**2 / var)`` (``var`` clamped at ``eps``)."""
    k = _kiln()
    if isinstance(var, float):
        if var < 0:
            raise ValueError("var has negative entry/entries")
        var = var * k.ones_like(input)
    elif bool(k.any(var < 0)):
        raise ValueError("var has negative entry/entries")
    if tuple(var._shape) != tuple(input._shape):
        if tuple(input._shape[:-1]) == tuple(var._shape):
            var = var.unsqueeze(-1)
        elif not (
            len(input._shape) == len(var._shape) and sum(b for a, b in zip(input._shape, var._shape) if a != b) == 1
        ):
            raise ValueError("var is of incorrect size")
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(reduction + " is not valid")
    # the clamp acts on the values only: the gradient reaches var unclamped, as in PyTorch
    var = var + (k.clamp(var, min=eps) - var).detach()
    loss = 0.5 * (k.log(var) + (input - target) ** 2 / var)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduce(loss, reduction)


# ---------------------------------------------------------------------------------------- margin / embedding losses


def margin_ranking_loss(input1, input2, target, margin=0, size_average=None, reduce=None, reduction="mean"):
    """``max(0, -target * (input1 - input2) + margin)``: ranks ``input1`` above ``input2`` where ``target`` is 1."""
    k = _kiln()
    reduction = _reduction(reduction, size_average, reduce)
    if len(input1._shape) != len(input2._shape) or len(input1._shape) != len(target._shape):
        raise RuntimeError(
            "margin_ranking_loss : All input tensors should have same dimension but got sizes: "
            f"input1: {input1.shape}, input2: {input2.shape}, target: {target.shape} "
        )
    return _reduce(k.clamp_min(-target * (input1 - input2) + margin, 0), reduction)


def hinge_embedding_loss(input, target, margin=1.0, size_average=None, reduce=None, reduction="mean"):
    """``input`` where ``target`` is 1, ``max(0, margin - input)`` where it is -1."""
    k = _kiln()
    reduction = _reduction(reduction, size_average, reduce)
    zeros = k.zeros_like(input)
    margin_part = k.where(k.ne(target, 1), k.clamp_min(margin - input, 0), zeros)
    self_part = k.where(k.ne(target, -1), input, zeros)
    return _reduce(margin_part + self_part, reduction)


def soft_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """Two-class logistic loss ``log(1 + exp(-target * input))``."""
    reduction = _reduction(reduction, size_average, reduce)
    _not_differentiable("soft_margin_loss", "target", target)
    d = dt.promote_types(input._dtype, target._dtype)
    if not d.is_floating_point:
        raise RuntimeError(f"result type Float can't be cast to the desired output type {scalar_type_name(d)}")
    return _reduce(_softplus_neg(input * target.detach()), reduction)


def cosine_embedding_loss(input1, input2, target, margin=0, size_average=None, reduce=None, reduction="mean"):
    """``1 - cos(x1, x2)`` where ``target`` is 1, ``max(0, cos(x1, x2) - margin)`` where it is -1."""
    k = _kiln()
    reduction = _reduction(reduction, size_average, reduce)
    tnd = len(target._shape)
    if tnd not in (0, 1):
        raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
    if tnd == 1 and not (len(input1._shape) == 2 and len(input2._shape) == 2):
        raise RuntimeError(
            "1D target tensor expects 2D input tensors, but found inputs with sizes "
            f"{list(input1._shape)} and {list(input2._shape)}."
        )
    if tnd == 0 and not (len(input1._shape) == 1 and len(input2._shape) == 1):
        raise RuntimeError(
            "0D target tensor expects 1D input tensors, but found inputs with sizes "
            f"{list(input1._shape)} and {list(input2._shape)}."
        )
    eps = 1e-12
    prod = (input1 * input2).sum(tnd)
    denom = k.sqrt(((input1 * input1).sum(tnd) + eps) * ((input2 * input2).sum(tnd) + eps))
    cos = prod / denom
    zeros = k.zeros_like(cos)
    pos = k.where(k.eq(target, 1), 1 - cos, zeros)
    neg = k.where(k.eq(target, -1), k.clamp_min(cos - margin, 0), zeros)
    return _reduce(pos + neg, reduction)


def _pairwise_distance(k, x1: Tensor, x2: Tensor, p: float, eps: float) -> Tensor:
    dim = 0 if max(len(x1._shape), len(x2._shape)) == 1 else -1
    return k.linalg.vector_norm(x1 - x2 + eps, p, dim)


def triplet_margin_loss(
    anchor,
    positive,
    negative,
    margin=1.0,
    p=2,
    eps=1e-6,
    swap=False,
    size_average=None,
    reduce=None,
    reduction="mean",
):
    """``max(0, d(a, p) - d(a, n) + margin)`` with ``d`` the p-norm distance (``swap``: use ``min(d(a, n), d(p, n))``)."""
    k = _kiln()
    reduction = _reduction(reduction, size_average, reduce)
    if margin <= 0:
        raise ValueError(f"margin must be greater than 0, got {margin}")
    a, pp, n = len(anchor._shape), len(positive._shape), len(negative._shape)
    if not a == pp == n:
        raise RuntimeError(
            "The anchor, positive, and negative tensors are expected to have the same number of dimensions, but "
            f"got: anchor {a}D, positive {pp}D, and negative {n}D inputs"
        )
    d_pos = _pairwise_distance(k, anchor, positive, p, eps)
    d_neg = _pairwise_distance(k, anchor, negative, p, eps)
    if swap:
        d_neg = k.minimum(d_neg, _pairwise_distance(k, positive, negative, p, eps))
    return _reduce(k.clamp_min(margin + d_pos - d_neg, 0), reduction)


def multilabel_soft_margin_loss(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """Multi-label one-versus-all logistic loss, averaged over the classes (last dim)."""
    if size_average is not None or reduce is not None:
        reduction = _legacy_reduction(size_average, reduce, 3)
    loss = target * _softplus_neg(input) + (1 - target) * _softplus_neg(-input)
    if weight is not None:
        loss = loss * weight
    class_dim = len(input._shape) - 1
    loss = loss.sum(class_dim) / input._shape[class_dim]
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(reduction + " is not valid")
    return _reduce(loss, reduction)


def multi_margin_loss(input, target, p=1, margin=1.0, weight=None, size_average=None, reduce=None, reduction="mean"):
    """Multi-class hinge loss ``sum_j max(0, margin - x[y] + x[j])**p / C`` over the classes ``j != y``."""
    k = _kiln()
    reduction = _reduction(reduction, size_average, reduce)
    if p not in (1, 2):
        raise ValueError("only p == 1 and p == 2 supported")
    if weight is not None and len(weight._shape) != 1:
        raise ValueError("weight must be one-dimensional")
    nd = len(input._shape)
    if nd > 2 or (nd > 0 and input._shape[-1] == 0):
        raise RuntimeError(
            f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: {list(input._shape)}"
        )
    n_classes = input._shape[-1] if nd else 1
    n = input._shape[0] if nd == 2 else 1
    if len(target._shape) > 1 or _numel(target._shape) != n:
        raise RuntimeError(
            "multi_margin_loss: target tensor should be 1-D with size equal to the number of input samples "
            f"(batch size). Expected target size [{n}], but got {list(target._shape)}. Input has shape "
            f"{list(input._shape)}."
        )
    if not input._dtype.is_floating_point:
        raise NotImplementedError(
            f"\"multi_margin_loss_cpu_kernel\" not implemented for '{scalar_type_name(input._dtype)}'"
        )
    if target._dtype is not dt.int64:
        raise RuntimeError(f"expected scalar type Long but found {scalar_type_name(target._dtype)}")
    if weight is not None:
        if weight._shape[0] != n_classes:
            raise RuntimeError(f"inconsistent weight size, expected {n_classes} but got {list(weight._shape)}")
        if weight._dtype is not input._dtype:
            raise RuntimeError(
                f"expected scalar type {scalar_type_name(input._dtype)} but found {scalar_type_name(weight._dtype)}"
            )
        _not_differentiable("multi_margin_loss", "weight", weight)
    if bool(k.any(k.logical_or(k.lt(target, 0), k.ge(target, n_classes)))):
        raise RuntimeError("target out of range")
    x = input.reshape(n, n_classes)
    t = target.reshape(n, 1)
    z = k.clamp_min(margin - x.gather(1, t) + x, 0)
    if p == 2:
        z = z * z
    if weight is not None:
        z = z * weight[t]
    z = k.where(k.eq(k.arange(n_classes, device=input.device), t), 0.0, z)
    loss = z.sum(1) / n_classes
    if reduction == "none":
        return loss.reshape(target._shape)
    return _reduce(loss, reduction)


# ---------------------------------------------------------------------------------------- ctc_loss


def _ctc_check(log_probs, targets, input_lengths, target_lengths, blank):
    """Validate the (batched) arguments; returns (T, N, C)."""
    t_max, n, c = log_probs._shape
    if not 0 <= blank < c:
        raise RuntimeError("blank must be in label range")
    if len(input_lengths) != n:
        raise RuntimeError("input_lengths must be of size batch_size")
    if len(target_lengths) != n:
        raise RuntimeError("target_lengths must be of size batch_size")
    where = " (while checking arguments for ctc_loss_allocate_outputs)"
    for v in input_lengths:
        if v < 0:
            raise RuntimeError(f"Expected input_lengths to have value at least 0, but got value {v}{where}")
        if v > t_max:
            raise RuntimeError(f"Expected input_lengths to have value at most {t_max}, but got value {v}{where}")
    for v in target_lengths:
        if v < 0:
            raise RuntimeError(f"Expected target_lengths to have value at least 0, but got value {v}{where}")
    if len(targets._shape) == 1:
        total = sum(target_lengths)
        if targets._shape[0] != total:
            raise RuntimeError(
                f"Expected tensor to have size {total} at dimension 0, but got size {targets._shape[0]} for "
                f"argument #2 'targets'{where}"
            )
    else:
        longest = max(target_lengths, default=0)
        if targets._shape[1] < longest:
            raise RuntimeError(
                f"Expected tensor to have size at least {longest} at dimension 1, but got size {targets._shape[1]} "
                f"for argument #2 'targets'{where}"
            )
    if not log_probs._dtype.is_floating_point:
        raise NotImplementedError(f"\"ctc_loss_cpu\" not implemented for '{scalar_type_name(log_probs._dtype)}'")
    return t_max, n, c


def _ctc_meta(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    _, n, _ = _ctc_check(log_probs, targets, input_lengths, target_lengths, blank)
    return ((n,), log_probs._dtype, log_probs._device)


def _ctc_labels(targets: np.ndarray, target_lengths, blank: int) -> np.ndarray:
    """Extended label sequences ``blank, l1, blank, l2, ..., blank``, padded with blank to a common length."""
    n = len(target_lengths)
    longest = max(target_lengths, default=0)
    ext = np.full((n, 2 * longest + 1), blank, np.int64)
    offset = 0
    for i, length in enumerate(target_lengths):  # one row per sample: loops over the batch only
        row = targets[offset : offset + length] if targets.ndim == 1 else targets[i, :length]
        offset += length
        ext[i, 1 : 2 * length : 2] = row.astype(np.int64)
    return ext


def _ctc_alpha_beta(lp: np.ndarray, ext: np.ndarray, input_lengths, target_lengths, blank: int, need_beta: bool):
    """Forward (and backward) log-variables over time, vectorised over batch and label positions.

    ``lp`` is (T, N, C) float64; returns (nll (N,), log alpha (T, N, S), log beta (T, N, S) or None)."""
    t_max, n, _ = lp.shape
    s_max = ext.shape[1]
    lengths = np.asarray(target_lengths, np.int64)
    tlen = np.asarray(input_lengths, np.int64)
    pos = np.arange(s_max)
    valid = pos[None, :] < (2 * lengths + 1)[:, None]  # (N, S)
    # a skip from s-2 is allowed onto a non-blank label that differs from the one two back
    skip = np.zeros((n, s_max), bool)
    skip[:, 2:] = (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])
    emit = np.take_along_axis(lp, np.broadcast_to(ext[None], (t_max, n, s_max)), axis=2)  # (T, N, S)
    neg = -np.inf
    alpha = np.full((t_max, n, s_max), neg)
    if t_max:
        alpha[0, :, 0] = emit[0, :, 0]
        alpha[0, :, 1] = np.where(lengths > 0, emit[0, :, 1], neg) if s_max > 1 else neg
        alpha[0] = np.where(valid, alpha[0], neg)
    with np.errstate(invalid="ignore"):
        for t in range(1, t_max):
            prev = alpha[t - 1]
            acc = prev.copy()
            acc[:, 1:] = np.logaddexp(acc[:, 1:], prev[:, :-1])
            acc[:, 2:] = np.where(skip[:, 2:], np.logaddexp(acc[:, 2:], prev[:, :-2]), acc[:, 2:])
            alpha[t] = np.where(valid, acc + emit[t], neg)
        last = np.clip(tlen - 1, 0, None)
        a_end = alpha[last, np.arange(n)] if t_max else np.full((n, s_max), neg)  # (N, S)
        end = 2 * lengths
        ll = a_end[np.arange(n), end]
        ll = np.where(lengths > 0, np.logaddexp(ll, a_end[np.arange(n), np.maximum(end - 1, 0)]), ll)
        ll = np.where(tlen == 0, np.where(lengths == 0, 0.0, neg), ll)
        nll = -ll
        if not need_beta:
            return nll, alpha, None
        beta = np.full((t_max, n, s_max), neg)
        for t in range(t_max - 1, -1, -1):
            init = np.full((n, s_max), neg)
            init[np.arange(n), end] = emit[t, np.arange(n), end]
            has = lengths > 0
            init[np.arange(n)[has], end[has] - 1] = emit[t, np.arange(n)[has], end[has] - 1]
            if t + 1 < t_max:
                nxt = beta[t + 1]
                acc = nxt.copy()
                acc[:, :-1] = np.logaddexp(acc[:, :-1], nxt[:, 1:])
                acc[:, :-2] = np.where(skip[:, 2:], np.logaddexp(acc[:, :-2], nxt[:, 2:]), acc[:, :-2])
                rec = acc + emit[t]
            else:
                rec = np.full((n, s_max), neg)
            step = np.where((t == tlen - 1)[:, None], init, np.where((t < tlen - 1)[:, None], rec, neg))
            beta[t] = np.where(valid, step, neg)
    return nll, alpha, beta


def _ctc_ref(spec, log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    lp = log_probs.astype(np.float64)
    ext = _ctc_labels(targets, target_lengths, blank)
    nll, _, _ = _ctc_alpha_beta(lp, ext, input_lengths, target_lengths, blank, False)
    return nll.astype(_compute_np(spec[1]))


def _ctc_backward(grad, log_probs, targets, input_lengths, target_lengths, blank, zero_infinity):
    return _ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, blank, zero_infinity), None


@op(meta=_ctc_meta, reference=_ctc_ref, backward=_ctc_backward, autocast="fp32", grad_fn_name="CtcLossBackward0")
def _ctc_loss(
    log_probs: Tensor,
    targets: Tensor,
    input_lengths: tuple,
    target_lengths: tuple,
    blank: int = 0,
    zero_infinity: bool = False,
) -> Tensor:
    """Per-sample CTC negative log likelihood of batched ``log_probs`` (T, N, C) and ``targets``."""


def _ctc_bwd_meta(grad, log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    _, n, _ = _ctc_check(log_probs, targets, input_lengths, target_lengths, blank)
    if not grad._dtype.is_floating_point:
        raise NotImplementedError(f"\"ctc_loss_backward_cpu\" not implemented for '{scalar_type_name(grad._dtype)}'")
    if grad._shape != (n,):
        raise RuntimeError(f"grad of shape {list(grad._shape)} does not match the loss shape {[n]}")
    return (log_probs._shape, log_probs._dtype, log_probs._device)


def _ctc_bwd_ref(spec, grad, log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    lp = log_probs.astype(np.float64)
    t_max, n, c = lp.shape
    ext = _ctc_labels(targets, target_lengths, blank)
    nll, alpha, beta = _ctc_alpha_beta(lp, ext, input_lengths, target_lengths, blank, True)
    ab = alpha + beta  # (T, N, S): log of (paths through s at t) * p(l'_s at t)
    post = np.full((t_max, n, c), -np.inf)
    rows = np.arange(n)
    for s in range(ext.shape[1]):  # one pass per extended-label position; each sample adds to one class
        cls = ext[:, s]
        post[:, rows, cls] = np.logaddexp(post[:, rows, cls], ab[:, :, s])
    with np.errstate(invalid="ignore", over="ignore"):
        g = np.exp(lp) - np.exp(post + nll[None, :, None] - lp)
    live = np.arange(t_max)[:, None] < np.asarray(input_lengths, np.int64)[None, :]
    g = np.where(live[:, :, None], g, 0.0)
    if zero_infinity:
        g = np.where(np.isinf(nll)[None, :, None], 0.0, g)
    return (g * grad.astype(np.float64)[None, :, None]).astype(_compute_np(spec[1]))


def _ctc_bwd_backward(grad):
    # as in PyTorch: CTC has no second derivative; refusing beats a silently partial one
    raise RuntimeError("derivative for aten::_ctc_loss_backward is not implemented")


@op(
    meta=_ctc_bwd_meta,
    reference=_ctc_bwd_ref,
    backward=_ctc_bwd_backward,
    autocast="fp32",
    grad_fn_name="CtcLossBackwardBackward0",
)
def _ctc_loss_backward(
    grad: Tensor,
    log_probs: Tensor,
    targets: Tensor,
    input_lengths: tuple,
    target_lengths: tuple,
    blank: int = 0,
    zero_infinity: bool = False,
) -> Tensor:
    """Gradient of :func:`_ctc_loss` for log-softmax outputs (PyTorch's formula: ``exp(lp) - posterior``)."""


def _lengths(v, name: str) -> tuple:
    if isinstance(v, Tensor):
        if v._dtype.is_floating_point or v._dtype is dt.bool:
            raise RuntimeError(f"{name} must be integral")
        return tuple(int(x) for x in np.asarray(v.detach().cpu().numpy()).reshape(-1))
    if not isinstance(v, (tuple, list)):
        raise TypeError(f"ctc_loss(): argument '{name}' must be tuple of ints or Tensor, not {type(v).__name__}")
    return tuple(int(x) for x in v)


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean", zero_infinity=False):
    """Connectionist Temporal Classification loss of ``log_probs`` (T, N, C) or unbatched (T, C)."""
    k = _kiln()
    reduction = _reduction(reduction)
    unbatched = len(log_probs._shape) == 2
    il = _lengths(input_lengths, "input_lengths")
    tl = _lengths(target_lengths, "target_lengths")
    if unbatched:
        log_probs = log_probs.unsqueeze(1)  # targets stay 1-D: one sample in the concatenated format
    if targets._dtype.is_floating_point:
        targets = targets.to(dt.int64)
    res = _ctc_loss(log_probs, targets, il, tl, blank, zero_infinity)
    if zero_infinity:
        res = k.where(k.isinf(res), 0.0, res)
    if unbatched:
        res = res.squeeze(0)
    if reduction == "mean":
        lengths = k.tensor([max(x, 1) for x in tl], dtype=res.dtype, device=res.device)
        return (res / (lengths.squeeze(0) if unbatched else lengths)).mean()
    return _reduce(res, reduction)

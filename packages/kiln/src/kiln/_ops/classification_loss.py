"""nn primitives: classification losses (``nll_loss``, ``cross_entropy``, ``binary_cross_entropy``,
``binary_cross_entropy_with_logits``; ``torch.nn.functional`` names, signatures, defaults and errors).

Fused ops (NumPy reference kernel + backward in kiln ops): ``_nll_loss`` (and its backward
``_nll_loss_backward``), ``_binary_cross_entropy`` and ``_binary_cross_entropy_with_logits``.
``cross_entropy`` is log-softmax (``softmax._log_softmax``) + nll (plus a composed smoothing term).
"""

from __future__ import annotations

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import broadcast_pair, scalar_type_name
from kiln._ops.elementwise import _compute_np
from kiln._ops.loss_reduction import _kiln, _not_differentiable, _reduce, _reduction
from kiln._ops.softmax import _log_softmax
from kiln._spec import Spec
from kiln._tensor import Tensor, _numel

__all__ = ["binary_cross_entropy", "binary_cross_entropy_with_logits", "cross_entropy", "nll_loss"]


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
    return Spec((shape, input._dtype, input._device))


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
    compute = _compute_np(spec.dtype)
    x, t = _nll_rows(input.astype(compute, copy=False), target)
    safe, w = _nll_pick(t, x.shape[1], weight, ignore_index, compute)
    picked = x[np.arange(x.shape[0]), safe] if x.shape[0] else np.zeros(0, compute)
    loss = np.where(w != 0, -w * picked, np.zeros((), compute))
    if reduction == "none":
        return loss.reshape(spec.shape)
    total = loss.sum(dtype=compute)
    if reduction == "sum":
        return np.asarray(total, compute)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(total / w.sum(dtype=compute), compute)


def _nll_backward(grad, input, target, weight, ignore_index, reduction):
    return _nll_loss_backward(grad, input, target, weight, ignore_index, reduction), None, None


def _nll_rows_picked(input, target, weight, ignore_index, compute):
    """The decompositions' :func:`_nll_rows` and :func:`_nll_pick` in kiln ops: (input as (rows, C), safe
    target indices as (rows, 1), per-row weights with 0 where ignored)."""
    from kiln._ops.elementwise import where
    from kiln._ops.index import index_select, masked_select
    from kiln._ops.reduction import any as _any

    x = input.to(compute)
    nd = x.dim()
    n_classes = x._shape[0] if nd == 1 else x._shape[1]
    if nd == 1:
        rows, t = x.reshape(1, n_classes), target.reshape(1)
    else:
        rows = x.permute(0, *range(2, nd), 1).reshape(-1, n_classes)
        t = target.reshape(-1)
    t = t.to(dt.int64)
    keep = t != ignore_index
    bad = keep & ((t < 0) | (t >= n_classes))
    if _any(bad).item():
        raise IndexError(f"Target {int(masked_select(t, bad)[0].item())} is out of bounds.")
    safe = where(keep, t, 0)
    w = keep.to(compute) if weight is None else where(keep, index_select(weight.to(compute), 0, safe), 0.0)
    return rows, safe.unsqueeze(1), w


def _nll_loss_decomposed(input, target, weight=None, ignore_index=-100, reduction="mean"):
    """``_nll_loss`` in kiln ops: the weighted negated log-probabilities of the targets, gathered per row
    (ignored rows count 0), then reduced (the mean divides by the total weight)."""
    from kiln._ops.elementwise import where
    from kiln._ops.gather_scatter import gather
    from kiln._ops.reduction import sum as _sum

    shape, dtype, _ = _nll_meta(input, target, weight, ignore_index, reduction)
    compute = dt.float32 if dtype in (dt.float16, dt.bfloat16) else dtype
    rows, safe, w = _nll_rows_picked(input, target, weight, ignore_index, compute)
    picked = gather(rows, 1, safe).reshape(-1)
    loss = where(w != 0, -w * picked, 0.0)
    if reduction == "none":
        return loss.reshape(shape).to(dtype)
    if reduction == "sum":
        return _sum(loss).to(dtype)
    return (_sum(loss) / _sum(w)).to(dtype)


@op(
    tags=("nn",),
    decompose=_nll_loss_decomposed,
    meta=_nll_meta,
    reference=_nll_ref,
    backward=_nll_backward,
    autocast="fp32",
    grad_fn_name="NllLossBackward0",
)
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
    return Spec((input._shape, grad._dtype, grad._device))


def _nll_bwd_ref(spec, grad, input, target, weight=None, ignore_index=-100, reduction="mean"):
    compute = _compute_np(spec.dtype)
    shape = spec.shape
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


def _nll_loss_backward_decomposed(grad, input, target, weight=None, ignore_index=-100, reduction="mean"):
    """``_nll_loss_backward`` in kiln ops: the per-row gradient scattered into zeros at the target classes."""
    from kiln._ops.creation import zeros
    from kiln._ops.elementwise import where
    from kiln._ops.gather_scatter import scatter
    from kiln._ops.reduction import sum as _sum

    shape, dtype, device = _nll_bwd_meta(grad, input, target, weight, ignore_index, reduction)
    compute = dt.float32 if dtype in (dt.float16, dt.bfloat16) else dtype
    rows, safe, w = _nll_rows_picked(input, target, weight, ignore_index, compute)
    g = grad.to(compute)
    if reduction == "none":
        scale = -w * g.reshape(-1)
    elif reduction == "sum":
        scale = -w * g
    else:
        scale = where(w != 0, -w * (g / _sum(w)), 0.0)
    out = scatter(zeros(rows._shape, dtype=compute, device=device), 1, safe, scale.reshape(-1, 1))
    nd = len(shape)
    if nd == 1:
        return out.reshape(shape).to(dtype)
    n_classes = shape[1]
    moved = out.reshape((shape[0],) + shape[2:] + (n_classes,))
    return moved.permute(0, nd - 1, *range(1, nd - 1)).contiguous().to(dtype)


@op(
    tags=("nn", "backward"),
    decompose=_nll_loss_backward_decomposed,
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
    return Spec((input._shape if reduction == "none" else (), input._dtype, input._device))


def _bce_ref(spec, input, target, weight=None, reduction="mean"):
    compute = _compute_np(spec.dtype)
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


def _reduce_decomposed(loss, reduction: str):
    """A loss's reduction in kiln ops, as :func:`_np_reduce` computes it (the mean of nothing is NaN)."""
    from kiln._ops.reduction import mean
    from kiln._ops.reduction import sum as _sum

    if reduction == "none":
        return loss
    return _sum(loss) if reduction == "sum" else mean(loss)


def _in_unit_interval(x) -> bool:
    from kiln._ops.elementwise import isnan
    from kiln._ops.reduction import any as _any

    return not _any((x < 0) | (x > 1) | isnan(x)).item()


def _binary_cross_entropy_decomposed(input, target, weight=None, reduction="mean"):
    """``_binary_cross_entropy`` in kiln ops: ``(t - 1) * log(1 - x) - t * log(x)``, the logs clamped at
    -100, weighted and reduced (inputs and targets outside [0, 1] raise, as in the reference)."""
    from kiln._ops.clamp import clamp_min
    from kiln._ops.elementwise import log
    from kiln._ops.unary_math import log1p

    dtype = _bce_meta(input, target, weight, reduction)[1]
    compute = dt.float32 if dtype in (dt.float16, dt.bfloat16) else dtype
    x, y = input.to(compute), target.to(compute)
    if not _in_unit_interval(x):
        raise RuntimeError("all elements of input should be between 0 and 1")
    if not _in_unit_interval(y):
        raise RuntimeError("all elements of target should be between 0 and 1")
    loss = (y - 1) * clamp_min(log1p(-x), -100.0) - y * clamp_min(log(x), -100.0)
    if weight is not None:
        loss = loss * weight.to(compute)
    return _reduce_decomposed(loss, reduction).to(dtype)


@op(
    autocast="banned_float16",
    tags=("nn",),
    decompose=_binary_cross_entropy_decomposed,
    meta=_bce_meta,
    reference=_bce_ref,
    backward=_bce_backward,
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
    return Spec((shape if reduction == "none" else (), dtype, input._device))


def _softplus_neg_np(x: np.ndarray) -> np.ndarray:
    """``log(1 + exp(-x))`` without overflow."""
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(-x, 0)


def _binary_cross_entropy_with_logits_decomposed(input, target, weight=None, pos_weight=None, reduction="mean"):
    """``_binary_cross_entropy_with_logits`` in kiln ops: ``(1 - t) * x + softplus(-x)`` (the latter scaled
    by ``(pos_weight - 1) * t + 1``), weighted and reduced."""
    from kiln._ops.clamp import clamp_min
    from kiln._ops.elementwise import abs as _abs
    from kiln._ops.elementwise import exp
    from kiln._ops.unary_math import log1p

    dtype = _bcel_meta(input, target, weight, pos_weight, reduction)[1]
    compute = dt.float32 if dtype in (dt.float16, dt.bfloat16) else dtype
    x, y = input.to(compute), target.to(compute)
    sp = log1p(exp(-_abs(x))) + clamp_min(-x, 0)
    if pos_weight is not None:
        sp = sp * ((pos_weight.to(compute) - 1) * y + 1)
    loss = (-y + 1) * x + sp
    if weight is not None:
        loss = loss * weight.to(compute)
    return _reduce_decomposed(loss, reduction).to(dtype)


def _bcel_ref(spec, input, target, weight=None, pos_weight=None, reduction="mean"):
    compute = _compute_np(spec.dtype)
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
    tags=("nn",),
    decompose=_binary_cross_entropy_with_logits_decomposed,
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

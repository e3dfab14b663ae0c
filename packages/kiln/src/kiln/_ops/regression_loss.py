"""nn primitives: regression losses (``mse_loss``, ``l1_loss``, ``smooth_l1_loss``, ``huber_loss``,
``kl_div``, ``poisson_nll_loss``, ``gaussian_nll_loss``; ``torch.nn.functional`` names, signatures,
defaults and errors), compositions of kiln ops as they are in PyTorch.
"""

from __future__ import annotations

import math
import warnings

from kiln import _dtype as dt
from kiln._dispatch import composite
from kiln._ops._meta import broadcast_pair, scalar_type_name
from kiln._ops.loss_reduction import _kiln, _legacy_reduction, _reduce, _reduction, _warn_size
from kiln._tensor import Tensor

__all__ = ["gaussian_nll_loss", "huber_loss", "kl_div", "l1_loss", "mse_loss", "poisson_nll_loss", "smooth_l1_loss"]


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


@composite(autocast="fp32")
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


@composite(autocast="fp32")
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


@composite(autocast="fp32")
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


@composite(autocast="fp32")
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


@composite(autocast="fp32")
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


@composite(autocast="fp32")
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

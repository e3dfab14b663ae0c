"""Functions of ``torch.nn.functional`` written in kiln ops (the core has no op for them): ``gumbel_softmax``,
``channel_shuffle``, two losses (``multilabel_margin_loss``, ``triplet_margin_with_distance_loss``),
``relu_`` and the deprecated ``upsample*`` aliases of ``interpolate``."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import kiln
from kiln import Tensor
from kiln.backend import composite
from kiln.nn._pool_args import not_implemented, scalar_type_name, shape_list

__all__ = [
    "gumbel_softmax",
    "channel_shuffle",
    "native_channel_shuffle",
    "multilabel_margin_loss",
    "triplet_margin_with_distance_loss",
    "relu_",
    "upsample",
    "upsample_nearest",
    "upsample_bilinear",
]


def gumbel_softmax(logits: Tensor, tau: float = 1, hard: bool = False, eps: float = 1e-10, dim: int = -1) -> Tensor:
    """A sample of the Gumbel-softmax distribution over ``dim`` (``torch.nn.functional.gumbel_softmax``):
    ``softmax((logits + g) / tau)`` with ``g ~ Gumbel(0, 1)`` drawn from kiln's generator. ``hard=True``
    returns the one-hot of the sample's argmax whose gradient is the soft sample's (straight-through).
    ``eps`` is deprecated and has no effect (a warning when given)."""
    if eps != 1e-10:
        warnings.warn("`eps` parameter is deprecated and has no effect.", stacklevel=2)
    gumbels = -kiln.empty_like(logits).exponential_().log()
    y_soft = ((logits + gumbels) / tau).softmax(dim)
    if not hard:
        return y_soft
    index = y_soft.max(dim, keepdim=True)[1]
    y_hard = kiln.zeros_like(logits).scatter_(dim, index, 1.0)
    return y_hard - y_soft.detach() + y_soft


def channel_shuffle(input: Tensor, groups: int) -> Tensor:
    """Interleave the channels of ``groups`` groups: ``(N, g*c, *)`` read as ``(N, g, c, *)``, transposed to
    ``(N, c, g, *)`` and flattened back (``torch.nn.functional.channel_shuffle``)."""
    if input.dim() <= 2:
        raise RuntimeError(
            f"channel_shuffle expects input with > 2 dims, but got input with sizes {shape_list(input.shape)}"
        )
    if groups <= 0:
        raise RuntimeError(f"Number of groups to divide channels in must be positive. Value of groups:{groups}")
    n, c, *rest = input.shape
    if c % groups != 0:
        raise RuntimeError(f"Number of channels must be divisible by groups. Got {c} channels and {groups} groups.")
    return input.reshape(n, groups, c // groups, *rest).transpose(1, 2).reshape(n, c, *rest)


def native_channel_shuffle(input: Tensor, groups: int) -> Tensor:
    """:func:`channel_shuffle` (``torch.nn.functional.native_channel_shuffle``, the same shuffle without
    PyTorch's oneDNN path)."""
    return channel_shuffle(input, groups)


def _reduction(size_average, reduce, reduction: str) -> str:
    if size_average is not None or reduce is not None:
        from kiln.nn.modules._utils import _legacy_reduction

        reduction = _legacy_reduction(size_average, reduce)
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    return reduction


@composite(autocast="fp32", name="multilabel_margin_loss")
def multilabel_margin_loss(
    input: Tensor, target: Tensor, size_average: bool | None = None, reduce: bool | None = None, reduction: str = "mean"
) -> Tensor:
    """Multi-class multi-label hinge loss (``torch.nn.functional.multilabel_margin_loss``).

    ``target`` (int64, ``input``'s shape) holds each sample's class indices, ended by the first ``-1``;
    the loss of a sample is ``Σ_j Σ_{i not a target} max(0, 1 - (x[y_j] - x[i])) / C``.
    """
    reduction = _reduction(size_average, reduce, reduction)
    if target.dtype != kiln.int64:
        raise RuntimeError(f"expected scalar type Long but found {scalar_type_name(target.dtype)}")
    ndim = input.dim()
    if ndim > 2 or (ndim == 1 and input.shape[0] == 0) or (ndim == 2 and input.shape[1] == 0):
        raise RuntimeError(
            f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: {shape_list(input.shape)}"
        )
    c = 1 if ndim == 0 else input.shape[-1]
    ok = target.dim() <= 1 and target.numel() == c if ndim <= 1 else tuple(target.shape) == tuple(input.shape)
    if not ok:
        raise RuntimeError(
            f"inconsistent target size: {shape_list(target.shape)} for input of size: {shape_list(input.shape)}"
        )
    if target.numel() and (bool((target < -1).any()) or bool((target >= c).any())):
        raise RuntimeError("argument #2 'target' is out of range")
    if not input.dtype.is_floating_point or input.dtype in (kiln.float16, kiln.bfloat16):
        raise not_implemented("multilabel_margin_loss_forward_out_frame", input.dtype)
    x = input.reshape(-1, c)
    y = target.reshape(-1, c)
    valid = (y >= 0).long().cumprod(1).bool()  # the targets before the first -1
    safe = kiln.where(valid, y, 0)
    classes = kiln.arange(c, device=input.device)
    is_target = ((safe.unsqueeze(2) == classes) & valid.unsqueeze(2)).any(1)  # (n, c)
    scores = x.gather(1, safe)  # (n, c): the score of each listed target
    margins = kiln.relu(1 - scores.unsqueeze(2) + x.unsqueeze(1))  # (n, target j, class i)
    keep = valid.unsqueeze(2) & ~is_target.unsqueeze(1)
    loss = kiln.where(keep, margins, 0).sum((1, 2)) / c
    if reduction == "none":
        return loss.reshape(()) if ndim <= 1 else loss
    total = loss.sum()
    return total / max(loss.shape[0], 1) if reduction == "mean" else total


def triplet_margin_with_distance_loss(
    anchor: Tensor,
    positive: Tensor,
    negative: Tensor,
    *,
    distance_function: Callable[[Tensor, Tensor], Tensor] | None = None,
    margin: float = 1.0,
    swap: bool = False,
    reduction: str = "mean",
) -> Tensor:
    """Triplet loss ``max(d(a, p) - d(a, n) + margin, 0)`` under any ``distance_function`` (default
    :func:`pairwise_distance`); ``swap`` uses ``min(d(a, n), d(p, n))`` as the negative distance
    (``torch.nn.functional.triplet_margin_with_distance_loss``)."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    if margin <= 0:
        raise ValueError(f"margin must be greater than 0, got {margin}")
    a_dim, p_dim, n_dim = anchor.ndim, positive.ndim, negative.ndim
    if not (a_dim == p_dim and p_dim == n_dim):
        raise RuntimeError(
            "The anchor, positive, and negative tensors are expected to have the same number of dimensions, but "
            f"got: anchor {a_dim}D, positive {p_dim}D, and negative {n_dim}D inputs"
        )
    if distance_function is None:
        from kiln.nn import functional

        distance_function = functional.pairwise_distance
    dist_pos = distance_function(anchor, positive)
    dist_neg = distance_function(anchor, negative)
    if swap:
        dist_neg = kiln.minimum(dist_neg, distance_function(positive, negative))
    loss = kiln.clamp_min(margin + dist_pos - dist_neg, 0)
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.mean()
    return loss


def relu_(input: Tensor) -> Tensor:
    """``max(input, 0)`` written into ``input`` (``torch.nn.functional.relu_``)."""
    return input.relu_()


def _interpolate(*args, **kwargs) -> Tensor:
    from kiln.nn import functional

    return functional.interpolate(*args, **kwargs)


def upsample(input: Tensor, size=None, scale_factor=None, mode: str = "nearest", align_corners=None) -> Tensor:
    """Deprecated alias of :func:`interpolate` (``torch.nn.functional.upsample``); warns."""
    warnings.warn("`nn.functional.upsample` is deprecated. Use `nn.functional.interpolate` instead.", stacklevel=2)
    return _interpolate(input, size, scale_factor, mode, align_corners)


def upsample_nearest(input: Tensor, size=None, scale_factor=None) -> Tensor:
    """Deprecated: ``interpolate(..., mode="nearest")`` (``torch.nn.functional.upsample_nearest``); warns."""
    warnings.warn(
        "`nn.functional.upsample_nearest` is deprecated. Use `nn.functional.interpolate` instead.", stacklevel=2
    )
    return _interpolate(input, size, scale_factor, mode="nearest")


def upsample_bilinear(input: Tensor, size=None, scale_factor=None) -> Tensor:
    """Deprecated: ``interpolate(..., mode="bilinear", align_corners=True)``
    (``torch.nn.functional.upsample_bilinear``); warns."""
    warnings.warn(
        "`nn.functional.upsample_bilinear` is deprecated. Use `nn.functional.interpolate` instead.", stacklevel=2
    )
    return _interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)

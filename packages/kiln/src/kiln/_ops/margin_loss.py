"""nn primitives: margin and embedding losses (``margin_ranking_loss``, ``hinge_embedding_loss``,
``soft_margin_loss``, ``cosine_embedding_loss``, ``triplet_margin_loss``, ``multilabel_soft_margin_loss``,
``multi_margin_loss``; ``torch.nn.functional`` names), compositions of kiln ops as they are in PyTorch.
"""

from __future__ import annotations

from kiln import _dtype as dt
from kiln._dispatch import composite
from kiln._ops._meta import scalar_type_name
from kiln._ops.classification_loss import _softplus_neg
from kiln._ops.loss_reduction import _kiln, _legacy_reduction, _not_differentiable, _reduce, _reduction
from kiln._tensor import Tensor, _numel

__all__ = [
    "cosine_embedding_loss",
    "hinge_embedding_loss",
    "margin_ranking_loss",
    "multi_margin_loss",
    "multilabel_soft_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
]


# ---------------------------------------------------------------------------------------- margin / embedding losses


@composite(autocast="fp32")
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


@composite(autocast="fp32")
def hinge_embedding_loss(input, target, margin=1.0, size_average=None, reduce=None, reduction="mean"):
    """``input`` where ``target`` is 1, ``max(0, margin - input)`` where it is -1."""
    k = _kiln()
    reduction = _reduction(reduction, size_average, reduce)
    zeros = k.zeros_like(input)
    margin_part = k.where(k.ne(target, 1), k.clamp_min(margin - input, 0), zeros)
    self_part = k.where(k.ne(target, -1), input, zeros)
    return _reduce(margin_part + self_part, reduction)


@composite(autocast="fp32")
def soft_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """Two-class logistic loss ``log(1 + exp(-target * input))``."""
    reduction = _reduction(reduction, size_average, reduce)
    _not_differentiable("soft_margin_loss", "target", target)
    d = dt.promote_types(input._dtype, target._dtype)
    if not d.is_floating_point:
        raise RuntimeError(f"result type Float can't be cast to the desired output type {scalar_type_name(d)}")
    return _reduce(_softplus_neg(input * target.detach()), reduction)


@composite(autocast="fp32")
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


@composite(autocast="fp32")
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


@composite(autocast="fp32")
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

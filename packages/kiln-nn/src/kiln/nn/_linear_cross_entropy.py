"""``linear_cross_entropy`` (``torch.nn.functional.linear_cross_entropy``): the cross entropy of a linear
projection's logits, by reference (``options=None``) or chunked through the batch
(:mod:`kiln.nn.modules.linear_cross_entropy`)."""

from __future__ import annotations

import math
import warnings

import kiln
from kiln import Tensor

__all__ = ["linear_cross_entropy"]


def linear_cross_entropy(
    input: Tensor,
    linear_weight: Tensor,
    target: Tensor,
    *,
    linear_bias: Tensor | None = None,
    weight: Tensor | None = None,
    reduction: str = "mean",
    ignore_index: int | None = None,
    label_smoothing: float = 0.0,
    options=None,
) -> Tensor:
    """``cross_entropy(linear(input, linear_weight, linear_bias), target, ...)``
    (``torch.nn.functional.linear_cross_entropy``).

    ``input`` is ``(in_features,)`` or ``(N, in_features)``; ``linear_weight`` ``(C, in_features)``, or
    ``(C, d_1, ..., d_K, in_features)`` for a K-dimensional loss over logits ``(N, C, d_1, ..., d_K)``.
    ``target`` holds class indices, or class probabilities shaped like the logits (then ``ignore_index``
    must stay ``None``; it means -100 otherwise). With ``options`` (a
    :class:`~kiln.nn.LinearCrossEntropyOptions`) the batch is processed in chunks whose logits are
    recomputed in the backward pass; configurations the chunked path does not cover (K-dimensional,
    label smoothing, probability targets) fall back to the reference path with PyTorch's warning.
    """
    from kiln.nn import functional as F

    if input.dim() < 1 or input.dim() > 2:
        raise RuntimeError(f"expected input with dimensionality 1 or 2, got {input.dim()}")
    if linear_weight.dim() < 2:
        raise RuntimeError(f"expected linear_weight with dimensionality at least 2, got {linear_weight.dim()}")
    batches = tuple(input.shape[:-1])
    in_features = input.shape[-1]
    if in_features != linear_weight.shape[-1]:
        raise RuntimeError(
            "expected equal input and linear_weight last dimensions (in_features), "
            f"got {input.shape[-1]} and {linear_weight.shape[-1]}, respectively"
        )
    num_classes = linear_weight.shape[0]
    out_features = tuple(linear_weight.shape[1:-1])
    if linear_bias is not None and tuple(linear_bias.shape) != (num_classes, *out_features):
        raise RuntimeError(f"expected linear_bias shape {(num_classes, *out_features)}, got {tuple(linear_bias.shape)}")
    if out_features and not batches:
        raise RuntimeError(
            f"K-dimensional loss defined by linear_weight shape {tuple(linear_weight.shape)} requires batched input, "
            f"(N, {in_features}), got unbatched input with shape {tuple(input.shape)}"
        )
    logits_shape = (*batches, num_classes, *out_features)
    probabilities = tuple(target.shape) == logits_shape
    if probabilities and ignore_index is not None:
        raise RuntimeError("ignore_index cannot be specified when target contains probabilities")
    ignore_index = ignore_index if ignore_index is not None else -100
    chunkable = (
        reduction in {"mean", "sum", "none"}
        and label_smoothing == 0.0
        and target.dtype == kiln.int64
        and not out_features
    )
    if options is not None and not chunkable:
        warnings.warn(
            "linear_cross_entropy: ``options`` ignored; chunked path needs reduction in {'mean','sum','none'}, "
            "label_smoothing == 0, target.dtype == int64, out_features == (). Got "
            f"reduction={reduction!r}, label_smoothing={label_smoothing}, target.dtype={target.dtype}, "
            f"out_features={out_features}, tracing=False, linear_bias.shape="
            f"{tuple(linear_bias.shape) if linear_bias is not None else None}.",
            stacklevel=2,
        )
    if options is not None and chunkable:
        from kiln.nn.modules.linear_cross_entropy import _linear_cross_entropy_chunked

        batched = input.dim() == 2
        x = input if batched else input.unsqueeze(0)
        t = target if batched else target.unsqueeze(0)
        resolved = options._adjust(x.shape[0], in_features, num_classes, input.dtype, input.device)
        out = _linear_cross_entropy_chunked(
            x, linear_weight, t, linear_bias, weight, reduction, ignore_index,
            resolved.batch_chunk_size, resolved.acc_dtype,
        )  # fmt: skip
        return out if batched or reduction != "none" else out.squeeze(0)
    if out_features:
        rows = math.prod(out_features) * num_classes
        linear_weight = linear_weight.reshape(rows, in_features)
        if linear_bias is not None:
            linear_bias = linear_bias.reshape(rows)
    logits = F.linear(input, linear_weight, linear_bias).reshape(logits_shape)
    return F.cross_entropy(
        logits, target, weight=weight, reduction=reduction, ignore_index=ignore_index, label_smoothing=label_smoothing
    )

"""The chunked ``linear_cross_entropy`` (PyTorch's path ``torch.nn.modules.linear_cross_entropy``, whose
names are private there too): the loss of ``cross_entropy(input @ weight.T + bias, target)`` computed
chunk by chunk of the batch, each chunk under :func:`kiln.utils.checkpoint.checkpoint` so that its logits are
recomputed in the backward pass rather than kept (the peak holds one chunk's logits)."""

from __future__ import annotations

import kiln
from kiln import Tensor

__all__: list[str] = []


def _chunk_loss(x: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, class_weight, ignore_index: int,
                reduction: str, acc) -> Tensor:  # fmt: skip
    from kiln.nn import functional as F

    logits = F.linear(x.to(acc), weight.to(acc), None if bias is None else bias.to(acc))
    cw = None if class_weight is None else class_weight.to(acc)
    return F.cross_entropy(logits, target, weight=cw, ignore_index=ignore_index, reduction=reduction)


def _linear_cross_entropy_chunked(
    input: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, class_weight: Tensor | None,
    reduction: str, ignore_index: int, chunk: int, acc,
) -> Tensor:  # fmt: skip
    """``(N, in)`` input, int64 ``(N,)`` target: the loss with ``reduction`` ("none", "sum", "mean"), in
    ``input``'s dtype, computed ``chunk`` rows at a time in dtype ``acc``."""
    from kiln.utils.checkpoint import checkpoint

    n = input.shape[0]
    per_chunk = "none" if reduction == "none" else "sum"
    parts = []
    for start in range(0, n, chunk):
        x, t = input[start : start + chunk], target[start : start + chunk]
        parts.append(
            checkpoint(_chunk_loss, x, weight, bias, t, class_weight, ignore_index, per_chunk, acc, use_reentrant=False)
        )
    if reduction == "none":
        out = kiln.cat(parts) if parts else input.new_zeros(0)
        return out.to(input.dtype)
    total = kiln.stack(parts).sum() if parts else input.new_zeros(())
    if reduction == "mean":
        # cross_entropy's mean: the weighted sum over the weights of the targets that are not ignored
        kept = target != ignore_index
        safe = kiln.where(kept, target, 0)
        if class_weight is None:
            denominator = kept.sum().to(total.dtype)
        else:
            denominator = kiln.where(kept, class_weight.to(total.dtype)[safe], 0).sum()
        total = total / denominator
    return total.to(input.dtype)

"""The chunked ``linear_cross_entropy`` (PyTorch's path ``torch.nn.modules.linear_cross_entropy``, whose
names are private there too): the loss of ``cross_entropy(input @ weight.T + bias, target)`` computed
chunk by chunk of the batch by a custom autograd function that keeps only its inputs and recomputes the
chunk's logits in the backward pass, so at most one chunk's logits exist at a time. Its backward is not
itself differentiable (as PyTorch's chunked path)."""

from __future__ import annotations

import kiln
from kiln import Tensor
from kiln.autograd import Function, once_differentiable

__all__: list[str] = []


def _chunk_loss(x, weight, bias, target, class_weight, ignore_index: int, reduction: str, acc) -> Tensor:
    from kiln.nn import functional as F

    logits = F.linear(x.to(acc), weight.to(acc), None if bias is None else bias.to(acc))
    cw = None if class_weight is None else class_weight.to(acc)
    return F.cross_entropy(logits, target, weight=cw, ignore_index=ignore_index, reduction=reduction)


class _ChunkLoss(Function):
    """One chunk's loss (``"sum"`` or ``"none"``), recomputed in ``backward``."""

    @staticmethod
    def forward(ctx, x, weight, bias, target, class_weight, ignore_index, reduction, acc):
        ctx.save_for_backward(x, weight, bias, target, class_weight)
        ctx.options = (ignore_index, reduction, acc)
        return _chunk_loss(x, weight, bias, target, class_weight, ignore_index, reduction, acc)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, weight, bias, target, class_weight = ctx.saved_tensors
        wanted = [(i, t) for i, t in enumerate((x, weight, bias)) if t is not None and ctx.needs_input_grad[i]]
        if not wanted:
            return (None,) * 8
        leaves = [t.detach().requires_grad_() for _, t in wanted]
        inputs = [x, weight, bias]
        for (i, _), leaf in zip(wanted, leaves):
            inputs[i] = leaf
        with kiln.enable_grad():
            loss = _chunk_loss(*inputs, target, class_weight, *ctx.options)
        grads = kiln.autograd.grad(loss, leaves, grad)
        out = [None] * 8
        for (i, _), g in zip(wanted, grads):
            out[i] = g
        return tuple(out)


def _linear_cross_entropy_chunked(
    input: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, class_weight: Tensor | None,
    reduction: str, ignore_index: int, chunk: int, acc,
) -> Tensor:  # fmt: skip
    """``(N, in)`` input, int64 ``(N,)`` target: the loss with ``reduction`` ("none", "sum", "mean"), in
    ``input``'s dtype, computed ``chunk`` rows at a time in dtype ``acc``."""
    n = input.shape[0]
    per_chunk = "none" if reduction == "none" else "sum"
    parts = [
        _ChunkLoss.apply(
            input[s : s + chunk], weight, bias, target[s : s + chunk], class_weight, ignore_index, per_chunk, acc
        )
        for s in range(0, n, chunk)
    ]
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

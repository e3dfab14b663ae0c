"""The ``reduction`` argument of the nn losses: PyTorch's legacy ``size_average``/``reduce`` mapping, the
reduction itself and the warnings and checks every loss shares.
"""

from __future__ import annotations

import warnings

from kiln._state import state
from kiln._tensor import Tensor

__all__ = []


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
    if isinstance(t, Tensor) and t.requires_grad and state.grad_enabled:
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

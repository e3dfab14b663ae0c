"""Distance layers: ``PairwiseDistance``, ``CosineSimilarity``; patch layers ``Fold``, ``Unfold``; ``ChannelShuffle``."""

from __future__ import annotations

from kiln import Tensor
from kiln.nn import functional as F
from kiln.nn.modules.module import Module

__all__ = ["PairwiseDistance", "CosineSimilarity", "Fold", "Unfold", "ChannelShuffle"]


class PairwiseDistance(Module):
    """``‖x1 - x2 + eps‖_p`` over the last dim (``torch.nn.PairwiseDistance``)."""

    __constants__ = ["norm", "eps", "keepdim"]

    def __init__(self, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> None:
        super().__init__()
        self.norm = p
        self.eps = eps
        self.keepdim = keepdim

    def forward(self, x1: Tensor, x2: Tensor) -> Tensor:
        """The p-norm distances."""
        return F.pairwise_distance(x1, x2, self.norm, self.eps, self.keepdim)


class CosineSimilarity(Module):
    """Cosine of the angle between ``x1`` and ``x2`` along ``dim`` (``torch.nn.CosineSimilarity``)."""

    __constants__ = ["dim", "eps"]

    def __init__(self, dim: int = 1, eps: float = 1e-8) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps

    def forward(self, x1: Tensor, x2: Tensor) -> Tensor:
        """The cosine similarities."""
        return F.cosine_similarity(x1, x2, self.dim, self.eps)


class Fold(Module):
    """Sum sliding blocks ``(N, C*prod(k), L)`` back into ``(N, C, *output_size)`` (``torch.nn.Fold``)."""

    __constants__ = ["output_size", "kernel_size", "dilation", "padding", "stride"]

    def __init__(self, output_size, kernel_size, dilation=1, padding=0, stride=1) -> None:
        super().__init__()
        self.output_size = output_size
        self.kernel_size = kernel_size
        self.dilation = dilation
        self.padding = padding
        self.stride = stride

    def forward(self, input: Tensor) -> Tensor:
        """The folded tensor."""
        return F.fold(input, self.output_size, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self) -> str:
        """``output_size=..., kernel_size=..., dilation=..., padding=..., stride=...``."""
        return (
            f"output_size={self.output_size}, kernel_size={self.kernel_size}, dilation={self.dilation}, "
            f"padding={self.padding}, stride={self.stride}"
        )


class Unfold(Module):
    """Extract sliding blocks of ``(N, C, H, W)`` as ``(N, C*prod(k), L)`` (``torch.nn.Unfold``)."""

    __constants__ = ["kernel_size", "dilation", "padding", "stride"]

    def __init__(self, kernel_size, dilation=1, padding=0, stride=1) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.dilation = dilation
        self.padding = padding
        self.stride = stride

    def forward(self, input: Tensor) -> Tensor:
        """The unfolded blocks."""
        return F.unfold(input, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self) -> str:
        """``kernel_size=..., dilation=..., padding=..., stride=...``."""
        return f"kernel_size={self.kernel_size}, dilation={self.dilation}, padding={self.padding}, stride={self.stride}"


class ChannelShuffle(Module):
    """Interleave the channels of ``groups`` groups: ``(N, g*c, *)`` -> ``(N, c*g, *)`` (``torch.nn.ChannelShuffle``)."""

    __constants__ = ["groups"]

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.groups = groups

    def forward(self, input: Tensor) -> Tensor:
        """The shuffled input."""
        return F.channel_shuffle(input, self.groups)

    def extra_repr(self) -> str:
        """``groups=...``."""
        return f"groups={self.groups}"

"""Resampling layers: ``PixelShuffle``, ``PixelUnshuffle``, ``Upsample``, ``UpsamplingNearest2d``, ``UpsamplingBilinear2d``."""

from __future__ import annotations

from kiln import Tensor
from kiln.nn import functional as F
from kiln.nn.modules.module import Module

__all__ = ["PixelShuffle", "PixelUnshuffle", "Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d"]


class PixelShuffle(Module):
    """Rearrange ``(*, C*r*r, H, W)`` into ``(*, C, H*r, W*r)`` (``torch.nn.PixelShuffle``)."""

    __constants__ = ["upscale_factor"]

    def __init__(self, upscale_factor: int) -> None:
        super().__init__()
        self.upscale_factor = upscale_factor

    def forward(self, input: Tensor) -> Tensor:
        """The shuffled input."""
        return F.pixel_shuffle(input, self.upscale_factor)

    def extra_repr(self) -> str:
        """``upscale_factor=...``."""
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
    """Rearrange ``(*, C, H*r, W*r)`` into ``(*, C*r*r, H, W)`` (``torch.nn.PixelUnshuffle``)."""

    __constants__ = ["downscale_factor"]

    def __init__(self, downscale_factor: int) -> None:
        super().__init__()
        self.downscale_factor = downscale_factor

    def forward(self, input: Tensor) -> Tensor:
        """The unshuffled input."""
        return F.pixel_unshuffle(input, self.downscale_factor)

    def extra_repr(self) -> str:
        """``downscale_factor=...``."""
        return f"downscale_factor={self.downscale_factor}"


class Upsample(Module):
    """Resample to ``size`` or by ``scale_factor`` with ``F.interpolate`` (``torch.nn.Upsample``)."""

    __constants__ = ["size", "scale_factor", "mode", "align_corners", "name", "recompute_scale_factor"]

    def __init__(
        self,
        size=None,
        scale_factor=None,
        mode: str = "nearest",
        align_corners: bool | None = None,
        recompute_scale_factor: bool | None = None,
    ) -> None:
        super().__init__()
        self.name = type(self).__name__
        self.size = size
        if isinstance(scale_factor, tuple):
            self.scale_factor = tuple(float(f) for f in scale_factor)
        else:
            self.scale_factor = float(scale_factor) if scale_factor else None
        self.mode = mode
        self.align_corners = align_corners
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, input: Tensor) -> Tensor:
        """The resampled input."""
        return F.interpolate(
            input,
            self.size,
            self.scale_factor,
            self.mode,
            self.align_corners,
            recompute_scale_factor=self.recompute_scale_factor,
        )

    def extra_repr(self) -> str:
        """``scale_factor=...`` (or ``size=...``) and ``mode=...``."""
        info = f"scale_factor={self.scale_factor!r}" if self.scale_factor is not None else f"size={self.size!r}"
        return info + f", mode={self.mode!r}"


class UpsamplingNearest2d(Upsample):
    """Nearest-neighbour 2-d upsampling (``torch.nn.UpsamplingNearest2d``)."""

    def __init__(self, size=None, scale_factor=None) -> None:
        super().__init__(size, scale_factor, mode="nearest")


class UpsamplingBilinear2d(Upsample):
    """Bilinear 2-d upsampling with ``align_corners=True`` (``torch.nn.UpsamplingBilinear2d``)."""

    def __init__(self, size=None, scale_factor=None) -> None:
        super().__init__(size, scale_factor, mode="bilinear", align_corners=True)

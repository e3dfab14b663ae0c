"""The upsampling layers under PyTorch's module path (``torch.nn.modules.upsampling``); they live in
:mod:`kiln.nn.modules.pixelshuffle`."""

from kiln.nn.modules.pixelshuffle import Upsample, UpsamplingBilinear2d, UpsamplingNearest2d

__all__ = ["Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d"]

"""``ChannelShuffle`` under PyTorch's module path (``torch.nn.modules.channelshuffle``); it lives in
:mod:`kiln.nn.modules.distance`."""

from kiln.nn.modules.distance import ChannelShuffle

__all__ = ["ChannelShuffle"]

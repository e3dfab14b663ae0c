"""``torch.utils.data.sampler``: the samplers, from :mod:`kiln.data` (``DistributedSampler`` is in
:mod:`kiln.utils.data.distributed`, as in PyTorch)."""

from kiln.data.sampler import *  # noqa: F403
from kiln.data.sampler import __all__ as _all

__all__ = [name for name in _all if name != "DistributedSampler"]

"""``torch.utils.data.distributed``: ``DistributedSampler``, from :mod:`kiln.data`."""

from kiln.data.sampler import DistributedSampler

__all__ = ["DistributedSampler"]

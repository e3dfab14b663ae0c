"""DistributedDataParallel's communication hooks (``torch.distributed.algorithms.ddp_comm_hooks``):
:mod:`~kiln.distributed.algorithms.ddp_comm_hooks.default_hooks`."""

from kiln.distributed.algorithms.ddp_comm_hooks import default_hooks

__all__ = ["default_hooks"]

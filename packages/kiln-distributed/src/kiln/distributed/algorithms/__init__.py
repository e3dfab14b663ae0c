"""``kiln.distributed.algorithms`` (``torch.distributed.algorithms``): DistributedDataParallel's
communication hooks, under :mod:`kiln.distributed.algorithms.ddp_comm_hooks`."""

"""``kiln.distributed.optim`` (``torch.distributed.optim``): :class:`ZeroRedundancyOptimizer`, an
optimizer whose state is sharded across the ranks of a process group."""

from __future__ import annotations

from kiln.distributed.optim.zero_redundancy_optimizer import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer"]

"""The standard communication hooks of DistributedDataParallel (PyTorch's ``default_hooks``).

A hook is ``hook(process_group, bucket) -> Future``: it reduces one :class:`~kiln.distributed.GradBucket`
and completes the future with the averaged flat gradients. Register one with
``ddp_model.register_comm_hook(process_group_or_None, hook)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import kiln
from kiln.distributed import distributed_c10d as _c10d
from kiln.distributed._groups import _default
from kiln.futures import Future

if TYPE_CHECKING:
    from kiln.distributed.ddp import GradBucket

__all__ = ["allreduce_hook", "bf16_compress_hook", "fp16_compress_hook"]


def _group(process_group: Any):
    return process_group if process_group is not None else _default()


def allreduce_hook(process_group: Any, bucket: GradBucket) -> Future:
    """Divide the bucket by the group's size, then all-reduce it (what DDP does without a hook)."""
    group = _group(process_group)
    tensor = bucket.buffer()
    with kiln.no_grad():
        tensor.div_(group.size())
    work = _c10d.all_reduce(tensor, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def _compress_hook(dtype, process_group: Any, bucket: GradBucket) -> Future:
    group = _group(process_group)
    buffer = bucket.buffer()
    with kiln.no_grad():
        compressed = buffer.to(dtype).div_(group.size())
    work = _c10d.all_reduce(compressed, group=group, async_op=True)

    def decompress(fut: Future):
        with kiln.no_grad():
            buffer.copy_(fut.value()[0])
        return buffer

    return work.get_future().then(decompress)


def fp16_compress_hook(process_group: Any, bucket: GradBucket) -> Future:
    """All-reduce the bucket in float16 (half the bytes on the wire), then write it back in its dtype."""
    return _compress_hook(kiln.float16, process_group, bucket)


def bf16_compress_hook(process_group: Any, bucket: GradBucket) -> Future:
    """All-reduce the bucket in bfloat16 (float32's range, half the bytes), then write it back in its dtype."""
    return _compress_hook(kiln.bfloat16, process_group, bucket)

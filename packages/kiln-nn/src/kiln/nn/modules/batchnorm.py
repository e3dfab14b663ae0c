"""The batch-norm layers under PyTorch's module path (``torch.nn.modules.batchnorm``); they live in
:mod:`kiln.nn.modules.normalization`. ``SyncBatchNorm`` belongs to kiln-distributed."""

from kiln.nn.modules.normalization import (
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    LazyBatchNorm1d,
    LazyBatchNorm2d,
    LazyBatchNorm3d,
)

__all__ = ["BatchNorm1d", "LazyBatchNorm1d", "BatchNorm2d", "LazyBatchNorm2d", "BatchNorm3d", "LazyBatchNorm3d"]

"""kiln.data: datasets, samplers and the DataLoader (``torch.utils.data``), plus datasets and transforms.

Installed by the ``kiln-data`` distribution. The names and signatures are PyTorch's, so
``from kiln.data import DataLoader, TensorDataset`` reads like ``from torch.utils.data import ...``.
Image datasets live in :mod:`kiln.data.datasets` and image transforms in :mod:`kiln.data.transforms`.
"""

from kiln.data._collate import default_collate, default_convert
from kiln.data._worker import WorkerInfo, get_worker_info
from kiln.data.dataloader import DataLoader
from kiln.data.dataset import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
    random_split,
)
from kiln.data.sampler import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

__all__ = [
    "Dataset",
    "IterableDataset",
    "TensorDataset",
    "Subset",
    "ConcatDataset",
    "ChainDataset",
    "StackDataset",
    "random_split",
    "Sampler",
    "SequentialSampler",
    "RandomSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
    "BatchSampler",
    "DistributedSampler",
    "DataLoader",
    "default_collate",
    "default_convert",
    "get_worker_info",
    "WorkerInfo",
]

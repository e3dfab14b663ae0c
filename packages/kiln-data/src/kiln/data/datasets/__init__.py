"""kiln.data.datasets: ready-made datasets (``torchvision.datasets``-style) and file-backed ones.

:class:`Digits` is embedded and works offline; :class:`MNIST`, :class:`FashionMNIST` and
:class:`CIFAR10` read their standard files under ``root`` (``download=True`` fetches them);
:class:`ImageFolder` reads class folders of images (needs Pillow); :class:`CSVDataset` and
:class:`NumpyDataset` wrap plain files.
"""

from kiln.data.datasets._digits import Digits, load_digits_arrays
from kiln.data.datasets._download import check_integrity, download_url
from kiln.data.datasets._files import CSVDataset, NumpyDataset
from kiln.data.datasets._folder import IMG_EXTENSIONS, DatasetFolder, ImageFolder, find_classes, pil_loader
from kiln.data.datasets._vision import CIFAR10, MNIST, FashionMNIST, read_idx

__all__ = [
    "Digits",
    "load_digits_arrays",
    "MNIST",
    "FashionMNIST",
    "CIFAR10",
    "ImageFolder",
    "DatasetFolder",
    "CSVDataset",
    "NumpyDataset",
    "find_classes",
    "pil_loader",
    "read_idx",
    "download_url",
    "check_integrity",
]

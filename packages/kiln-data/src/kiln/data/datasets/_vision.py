"""MNIST, Fashion-MNIST and CIFAR-10 from their standard files under ``root``.

Images come as NumPy uint8 arrays in height x width (x channels) order, the form ``PIL.Image``
converts to, so ``transforms.ToTensor()`` turns them into CHW float tensors. Each class keeps its
download table in class attributes (``mirrors``/``resources``, ``url``/``tgz_md5``) so that a mirror,
or a test server, can stand in for the original host.
"""

from __future__ import annotations

import gzip
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np

from kiln.data.dataset import Dataset
from kiln.data.datasets._download import check_integrity, download_url

__all__ = ["MNIST", "FashionMNIST", "CIFAR10", "read_idx"]

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (MNIST's format), gzip-compressed or not."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise RuntimeError(f"{path} is not an IDX file")
    ndim = raw[3]
    dims = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    data = np.frombuffer(raw, dtype=dtype, offset=4 + 4 * ndim, count=int(np.prod(dims)))
    return data.reshape(dims).astype(dtype.newbyteorder("="))


class _ImageDataset(Dataset):
    def __init__(self, root, transform, target_transform) -> None:
        self.root = Path(os.path.expanduser(root))
        self.transform = transform
        self.target_transform = target_transform

    def __getitem__(self, index: int):
        image, target = self.data[index], int(self.targets[index])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target

    def __len__(self) -> int:
        return len(self.data)


class MNIST(_ImageDataset):
    """The MNIST handwritten digits (60,000 train / 10,000 test, 28x28 grey) from ``root/MNIST/raw``.

    ``download=True`` fetches the four IDX ``.gz`` files from the first mirror that answers, checking
    their md5, unless they are already there. A sample is ``(image, label)`` with ``image`` a uint8
    28x28 array (before ``transform``).
    """

    mirrors = ["https://ossci-datasets.s3.amazonaws.com/mnist/"]
    resources = [
        ("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
        ("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432"),
        ("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3"),
        ("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c"),
    ]
    classes = [
        "0 - zero",
        "1 - one",
        "2 - two",
        "3 - three",
        "4 - four",
        "5 - five",
        "6 - six",
        "7 - seven",
        "8 - eight",
        "9 - nine",
    ]

    def __init__(self, root, train: bool = True, transform=None, target_transform=None, download: bool = False):
        super().__init__(root, transform, target_transform)
        self.train = train
        if download:
            self.download()
        prefix = "train" if train else "t10k"
        images = self._find(f"{prefix}-images-idx3-ubyte")
        labels = self._find(f"{prefix}-labels-idx1-ubyte")
        self.data = read_idx(images)
        self.targets = read_idx(labels).astype(np.int64)

    @property
    def raw_folder(self) -> Path:
        """Where the IDX files live: ``root/<ClassName>/raw``."""
        return self.root / type(self).__name__ / "raw"

    def _find(self, stem: str) -> Path:
        for name in (stem, stem + ".gz"):
            if (self.raw_folder / name).is_file():
                return self.raw_folder / name
        raise RuntimeError("Dataset not found. You can use download=True to download it")

    def download(self) -> None:
        """Fetch every missing or corrupt file of ``resources`` into :attr:`raw_folder`."""
        for filename, md5 in self.resources:
            target = self.raw_folder / filename
            if check_integrity(target, md5):
                continue
            errors = []
            for mirror in self.mirrors:
                try:
                    download_url(mirror + filename, target, md5=md5)
                    break
                except (OSError, RuntimeError) as exc:  # try the next mirror; all failing raises below
                    errors.append(f"{mirror}: {exc}")
            else:
                raise RuntimeError(f"Error downloading {filename}:\n" + "\n".join(errors))

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name to label."""
        return {c: i for i, c in enumerate(self.classes)}


class FashionMNIST(MNIST):
    """Zalando's Fashion-MNIST (same files and layout as :class:`MNIST`, under ``root/FashionMNIST/raw``)."""

    mirrors = ["http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"]
    resources = [
        ("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
        ("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe"),
        ("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79"),
        ("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310"),
    ]
    classes = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


class CIFAR10(_ImageDataset):
    """CIFAR-10 (50,000 train / 10,000 test 32x32 colour images, 10 classes) from the python-pickle batches.

    Reads ``root/cifar-10-batches-py``; ``download=True`` fetches and checks ``url`` (md5 ``tgz_md5``)
    and extracts it. A sample is ``(image, label)`` with ``image`` a uint8 32x32x3 array.
    """

    base_folder = "cifar-10-batches-py"
    url = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    filename = "cifar-10-python.tar.gz"
    tgz_md5 = "c58f30108f718f92721af3b95e74349a"
    train_list = ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5"]
    test_list = ["test_batch"]
    meta = {"filename": "batches.meta", "key": "label_names"}

    def __init__(self, root, train: bool = True, transform=None, target_transform=None, download: bool = False):
        super().__init__(root, transform, target_transform)
        self.train = train
        if download:
            self.download()
        folder = self.root / self.base_folder
        if not all((folder / n).is_file() for n in (*self.train_list, *self.test_list)):
            raise RuntimeError("Dataset not found or corrupted. You can use download=True to download it")
        data, targets = [], []
        for name in self.train_list if train else self.test_list:
            with open(folder / name, "rb") as f:
                entry = pickle.load(f, encoding="latin1")
            data.append(entry["data"])
            targets.extend(entry["labels"] if "labels" in entry else entry["fine_labels"])
        self.data = np.vstack(data).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy()
        self.targets = np.asarray(targets, dtype=np.int64)
        with open(folder / self.meta["filename"], "rb") as f:
            self.classes = pickle.load(f, encoding="latin1")[self.meta["key"]]
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

    def download(self) -> None:
        """Fetch and extract the archive unless the batches are already there."""
        folder = self.root / self.base_folder
        if all((folder / n).is_file() for n in (*self.train_list, *self.test_list)):
            return
        archive = download_url(self.url, self.root / self.filename, md5=self.tgz_md5)
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(self.root, filter="data")

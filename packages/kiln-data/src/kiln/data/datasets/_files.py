"""Datasets over plain files: CSV tables and NumPy ``.npy``/``.npz`` arrays."""

from __future__ import annotations

import os

import numpy as np

import kiln
from kiln.data.dataset import Dataset

__all__ = ["CSVDataset", "NumpyDataset"]


class CSVDataset(Dataset):
    """Rows of a numeric CSV file: ``(features, target)`` with features a float32 tensor.

    ``target_column`` (an index or a header name; ``None``: no target, samples are the features alone)
    is split off; integral targets come as ints, others as floats. ``header=True`` reads column names
    from the first line (``columns``).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        target_column: int | str | None = -1,
        header: bool = True,
        delimiter: str = ",",
        dtype=None,
        transform=None,
        target_transform=None,
    ) -> None:
        with open(path) as f:
            self.columns = [c.strip() for c in f.readline().split(delimiter)] if header else None
        table = np.loadtxt(path, delimiter=delimiter, skiprows=1 if header else 0, ndmin=2, dtype=np.float64)
        if target_column is not None:
            if isinstance(target_column, str):
                if self.columns is None or target_column not in self.columns:
                    raise KeyError(f"no column named {target_column!r} in {path}")
                target_column = self.columns.index(target_column)
            target_column %= table.shape[1]
            y = table[:, target_column]
            self.targets = y.astype(np.int64) if np.all(y == np.round(y)) else y
            table = np.delete(table, target_column, axis=1)
        else:
            self.targets = None
        d = dtype or kiln.float32
        self.data = table.astype(d.numpy)
        self.transform = transform
        self.target_transform = target_transform

    def __getitem__(self, index: int):
        x = kiln.from_numpy(self.data[index].copy())
        if self.transform is not None:
            x = self.transform(x)
        if self.targets is None:
            return x
        y = self.targets[index].item()
        if self.target_transform is not None:
            y = self.target_transform(y)
        return x, y

    def __len__(self) -> int:
        return len(self.data)


class NumpyDataset(Dataset):
    """Rows of NumPy arrays in ``.npy`` files (or the named arrays of one ``.npz``): a tuple of tensors per sample.

    ``.npy`` files are memory-mapped (``mmap_mode``), so data sets larger than memory work; each sample
    is copied out of the map. All arrays must share their first dimension.
    """

    def __init__(self, *paths: str | os.PathLike, keys: list[str] | None = None, mmap_mode: str | None = "r"):
        if len(paths) == 1 and str(paths[0]).endswith(".npz"):
            with np.load(paths[0]) as npz:
                names = keys or list(npz.files)
                self.arrays = [npz[k] for k in names]
        else:
            self.arrays = [np.load(p, mmap_mode=mmap_mode) for p in paths]
        if not self.arrays:
            raise ValueError("NumpyDataset needs at least one array")
        n = len(self.arrays[0])
        if any(len(a) != n for a in self.arrays):
            raise ValueError("Size mismatch between arrays")

    def __getitem__(self, index: int):
        return tuple(kiln.from_numpy(np.array(a[index])) for a in self.arrays)

    def __len__(self) -> int:
        return len(self.arrays[0])

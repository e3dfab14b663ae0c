"""The 8x8 handwritten digits (UCI optdigits test set, CC BY 4.0), embedded in the package."""

from __future__ import annotations

from importlib import resources

import numpy as np

import kiln
from kiln.data.dataset import Dataset

__all__ = ["Digits", "load_digits_arrays"]


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The embedded images (uint8, 1797x8x8, values 0-16) and labels (int64, 0-9)."""
    with resources.files("kiln.data.datasets").joinpath("digits.npz").open("rb") as f, np.load(f) as npz:
        return npz["images"].copy(), npz["labels"].astype(np.int64)


class Digits(Dataset):
    """1,797 8x8 grey images of handwritten digits with labels 0-9, available offline.

    A sample is ``(image, label)``: ``image`` a float32 tensor of shape (1, 8, 8) scaled to [0, 1]
    (the raw pixel counts 0-16 divided by 16), ``label`` an int. ``data`` (uint8 counts) and ``targets``
    hold the raw arrays. Source and licence (CC BY 4.0): see the kiln-data README.
    """

    classes = [str(i) for i in range(10)]

    def __init__(self, transform=None, target_transform=None) -> None:
        self.data, self.targets = load_digits_arrays()
        self._images = (self.data.astype(np.float32) / 16.0)[:, None]
        self.transform = transform
        self.target_transform = target_transform

    def __getitem__(self, index: int):
        image, target = kiln.from_numpy(self._images[index].copy()), int(self.targets[index])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target

    def __len__(self) -> int:
        return len(self.targets)

"""``ImageFolder``/``DatasetFolder``: one sub-folder per class, one file per sample."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from kiln.data.dataset import Dataset

__all__ = ["DatasetFolder", "ImageFolder", "IMG_EXTENSIONS", "pil_loader", "find_classes"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
"""The file name endings ``ImageFolder`` loads (case-insensitive); also ``kiln.data.datasets.IMG_EXTENSIONS``."""


def find_classes(directory: str | os.PathLike) -> tuple[list[str], dict[str, int]]:
    """The class folders of ``directory``, sorted, and their labels."""
    classes = sorted(e.name for e in os.scandir(directory) if e.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
    return classes, {c: i for i, c in enumerate(classes)}


def pil_loader(path: str | os.PathLike) -> np.ndarray:
    """An image file as a uint8 height x width x 3 (RGB) array, decoded by Pillow."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise ImportError("ImageFolder needs Pillow: pip install 'kiln-data[images]'") from exc
    with open(path, "rb") as f, Image.open(f) as img:
        return np.asarray(img.convert("RGB")).copy()


class DatasetFolder(Dataset):
    """Samples ``(loader(path), class_index)`` from ``root/<class>/**/<file>``, classes sorted by name.

    Files are kept if their extension is in ``extensions`` (or ``is_valid_file(path)`` says so).
    """

    def __init__(
        self,
        root,
        loader,
        extensions: tuple[str, ...] | None = None,
        transform=None,
        target_transform=None,
        is_valid_file=None,
        allow_empty: bool = False,
    ) -> None:
        if (extensions is None) == (is_valid_file is None):
            raise ValueError("Both extensions and is_valid_file cannot be None or not None at the same time")
        self.root = Path(os.path.expanduser(root))
        self.loader = loader
        self.extensions = extensions
        self.transform = transform
        self.target_transform = target_transform
        self.classes, self.class_to_idx = find_classes(self.root)
        if is_valid_file is None:
            lowered = tuple(e.lower() for e in extensions)
            is_valid_file = lambda p: str(p).lower().endswith(lowered)
        self.samples: list[tuple[str, int]] = []
        for cls in self.classes:
            found = False
            for dirpath, _, files in sorted(os.walk(self.root / cls, followlinks=True)):
                for name in sorted(files):
                    path = os.path.join(dirpath, name)
                    if is_valid_file(path):
                        self.samples.append((path, self.class_to_idx[cls]))
                        found = True
            if not found and not allow_empty:
                raise FileNotFoundError(
                    f"Found no valid file for the classes {cls}. Supported extensions are: {self.extensions}"
                )
        self.targets = [s[1] for s in self.samples]

    def __getitem__(self, index: int):
        path, target = self.samples[index]
        sample = self.loader(path)
        if self.transform is not None:
            sample = self.transform(sample)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target

    def __len__(self) -> int:
        return len(self.samples)


class ImageFolder(DatasetFolder):
    """Images in ``root/<class>/<file>`` (see :class:`DatasetFolder`), decoded by Pillow into HWC uint8 arrays."""

    def __init__(
        self, root, transform=None, target_transform=None, loader=pil_loader, is_valid_file=None, allow_empty=False
    ) -> None:
        super().__init__(
            root,
            loader,
            IMG_EXTENSIONS if is_valid_file is None else None,
            transform=transform,
            target_transform=target_transform,
            is_valid_file=is_valid_file,
            allow_empty=allow_empty,
        )
        self.imgs = self.samples

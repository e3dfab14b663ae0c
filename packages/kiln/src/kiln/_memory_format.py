"""Memory-format requests (``torch.memory_format``): ``kiln.contiguous_format`` and ``kiln.preserve_format``.

They sit at the bottom layer so that ``Tensor``'s own methods (``t.float(memory_format=...)``) and the
ops (``clone``, the ``*_like`` creation functions) share the same objects.
"""

from __future__ import annotations

__all__ = ["check_memory_format", "contiguous_format", "memory_format", "preserve_format"]


class memory_format:  # noqa: N801 - PyTorch's name
    """A memory layout request: ``kiln.contiguous_format`` (row-major) or ``kiln.preserve_format``."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"kiln.{self.name}"


contiguous_format = memory_format("contiguous_format")
preserve_format = memory_format("preserve_format")


def check_memory_format(fn: str, value) -> None:
    """Refuse a memory format kiln cannot honour (``None`` means the default, ``preserve_format``)."""
    if value not in (None, contiguous_format, preserve_format):
        raise RuntimeError(f"{fn}(): unsupported memory format {value!r}")

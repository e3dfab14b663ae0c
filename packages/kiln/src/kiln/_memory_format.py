"""Memory-format requests (``torch.memory_format``: ``kiln.contiguous_format``, ``kiln.preserve_format``)
and layouts (``torch.layout``: ``kiln.strided``, ``kiln.sparse_coo``).

They sit at the bottom layer so that ``Tensor``'s own methods (``t.float(memory_format=...)``), the ops
(``clone``, the creation functions' ``layout=`` and ``memory_format=`` defaults) and sparse tensors share
the same objects.
"""

from __future__ import annotations

__all__ = [
    "check_memory_format",
    "contiguous_format",
    "layout",
    "memory_format",
    "preserve_format",
    "sparse_coo",
    "strided",
]


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


class layout:
    """A tensor's memory layout (``torch.layout``): :data:`kiln.strided` for dense tensors,
    :data:`kiln.sparse_coo` for sparse COO tensors. Read it from :attr:`Tensor.layout`."""

    __slots__ = ("name",)

    def __new__(cls, *args, **kwargs):
        raise TypeError("cannot create 'kiln.layout' instances")

    def __repr__(self) -> str:
        return f"kiln.{self.name}"

    def __reduce__(self) -> str:
        return self.name  # pickled by reference to this module's attribute


def _layout(name: str) -> layout:
    obj = object.__new__(layout)
    obj.name = name
    return obj


strided = _layout("strided")
sparse_coo = _layout("sparse_coo")

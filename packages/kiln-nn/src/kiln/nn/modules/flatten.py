"""Shape layers: ``Flatten`` and ``Unflatten``."""

from __future__ import annotations

from kiln import Tensor
from kiln.nn.modules.module import Module

__all__ = ["Flatten", "Unflatten"]


class Flatten(Module):
    """Flatten dimensions ``start_dim`` to ``end_dim`` into one (``torch.nn.Flatten``; batch kept by default)."""

    __constants__ = ["start_dim", "end_dim"]

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim = start_dim
        self.end_dim = end_dim

    def forward(self, input: Tensor) -> Tensor:
        """``input.flatten(start_dim, end_dim)``."""
        return input.flatten(self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        """``start_dim=..., end_dim=...``."""
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """Expand dimension ``dim`` into ``unflattened_size`` (``torch.nn.Unflatten``)."""

    def __init__(self, dim: int | str, unflattened_size) -> None:
        super().__init__()
        if isinstance(dim, int):
            if not isinstance(unflattened_size, tuple | list):
                raise TypeError(
                    f"unflattened_size must be tuple of ints, but found type {type(unflattened_size).__name__}"
                )
            for idx, elem in enumerate(unflattened_size):
                if not isinstance(elem, int):
                    raise TypeError(
                        f"unflattened_size must be tuple of ints, but found element of type {type(elem).__name__} at pos {idx}"
                    )
        else:
            raise TypeError(
                f"invalid argument type for dim parameter: {type(dim).__name__} (named dimensions are not supported)"
            )
        self.dim = dim
        self.unflattened_size = unflattened_size

    def forward(self, input: Tensor) -> Tensor:
        """``input.unflatten(dim, unflattened_size)``."""
        return input.unflatten(self.dim, self.unflattened_size)

    def extra_repr(self) -> str:
        """``dim=..., unflattened_size=...``."""
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"

"""``kiln.linalg``: norms (``torch.linalg``'s names). The matrix products live in :mod:`kiln` itself."""

from __future__ import annotations

from kiln._ops.scans import vector_norm

__all__ = ["vector_norm"]

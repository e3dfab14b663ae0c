"""``kiln._dynamo.exc``: the exceptions ``torch._dynamo.exc`` names, as kiln.compile raises them."""

from __future__ import annotations

from kiln.compile import BackendCompilerFailed, GraphBreakError

Unsupported = GraphBreakError
"""What ``fullgraph=True`` raises at a graph break (``torch._dynamo.exc.Unsupported``): kiln.compile's
``GraphBreakError``."""

__all__ = ["BackendCompilerFailed", "Unsupported"]

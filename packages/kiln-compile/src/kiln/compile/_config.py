"""``kiln.compile.config``: the compiler's settings (PyTorch keeps these in ``torch._dynamo.config``)."""

from __future__ import annotations

cache_size_limit: int = 8
"""How many traces one compiled function keeps (each for another set of guards) before it runs eagerly
whenever no trace's guards hold, with a warning; PyTorch's default is 8 as well."""

disabled: bool = False
"""True: every compiled function runs its original code (``kiln.compile.disable()`` without a function
sets it, as ``TORCHDYNAMO_DISABLE=1`` does in PyTorch; the environment variable ``KILN_COMPILE_DISABLE=1``
sets it at import)."""

"""Functions of a higher layer bound on their first call.

A hot-path function in a low layer (``kiln._tensor``, ``kiln._ops.copy``) that calls into a module importing
it cannot import that module at its top (the import would go in a circle), and an import statement inside
the function costs 0.6 us on every call, even with the module loaded: ``s[i] = 1.0`` spent a fifth of its
time in them. :func:`first_call` makes a stand-in that imports the real function once and takes its place.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["first_call"]


def first_call(namespace: dict[str, Any], module: str, name: str, alias: str | None = None) -> Callable:
    """A stand-in for ``module.name``, to be bound in ``namespace`` (a module's ``globals()``) as ``alias``
    (default ``name``): its first call imports the function, puts it in the stand-in's place and calls it,
    so later calls through the module's global go straight to the function."""
    key = alias or name

    def stand_in(*args: Any, **kwargs: Any) -> Any:
        fn = getattr(importlib.import_module(module), name)
        namespace[key] = fn
        return fn(*args, **kwargs)

    stand_in.__name__ = stand_in.__qualname__ = key
    stand_in.__doc__ = f"``{module}.{name}``, imported on the first call."
    return stand_in

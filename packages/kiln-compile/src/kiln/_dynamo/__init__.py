"""``kiln._dynamo``: the names of ``torch._dynamo`` that training scripts use, so they run unchanged.

``config`` is ``kiln.compile.config`` under ``torch._dynamo.config``'s names as well (``recompile_limit`` is
``cache_size_limit``, ``accumulated_recompile_limit`` is ``accumulated_cache_size_limit``, ``disable`` is
``disabled``; an option kiln does not have raises ``AttributeError``, as PyTorch's does). :func:`reset`,
:func:`disable`, :func:`explain`, :func:`is_compiling`, :func:`list_backends` and :func:`allow_in_graph` are
kiln.compile's (``kiln.compiler``'s); ``exc`` holds ``Unsupported`` (kiln.compile's ``GraphBreakError``) and
``BackendCompilerFailed``.
"""

from __future__ import annotations

import types
from typing import Any

from kiln._dynamo import exc
from kiln.compile import _config, disable, explain, is_compiling, list_backends, reset
from kiln.compiler import allow_in_graph

__all__ = ["allow_in_graph", "config", "disable", "exc", "explain", "is_compiling", "list_backends", "reset"]

_ALIASES = {
    "recompile_limit": "cache_size_limit",
    "accumulated_recompile_limit": "accumulated_cache_size_limit",
    "disable": "disabled",
}
_OPTIONS = frozenset(_config.__annotations__)  # the settings kiln.compile.config declares


class _Config(types.ModuleType):
    """``kiln.compile.config`` under ``torch._dynamo.config``'s names (:data:`_ALIASES` too): reads and writes
    go to kiln.compile's settings; an option it does not have raises ``AttributeError``."""

    def __getattr__(self, name: str) -> Any:
        target = _ALIASES.get(name, name)
        if target not in _OPTIONS:
            raise AttributeError(f"kiln._dynamo.config.{name} does not exist")
        return getattr(_config, target)

    def __setattr__(self, name: str, value: Any) -> None:
        target = _ALIASES.get(name, name)
        if target not in _OPTIONS:
            raise AttributeError(f"kiln._dynamo.config.{name} does not exist")
        setattr(_config, target, value)

    def __dir__(self) -> list[str]:
        return sorted(_OPTIONS | set(_ALIASES))


config = _Config("kiln._dynamo.config", "torch._dynamo.config's names for kiln.compile.config's settings.")

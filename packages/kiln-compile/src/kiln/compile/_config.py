"""``kiln.compile.config``: the compiler's settings (PyTorch keeps these in ``torch._dynamo.config``, which
``kiln._dynamo.config`` is: this module, which also reads and writes them under PyTorch's names,
:data:`ALIASES`, and sets them for a block with :func:`patch`)."""

from __future__ import annotations

import contextlib
import sys
import types
from typing import Any

cache_size_limit: int = 8
"""How many traces one compiled function keeps (each for another set of guards) before it runs eagerly
whenever no trace's guards hold, with a warning; PyTorch's default is 8 as well."""

disabled: bool = False
"""True: every compiled function runs its original code (PyTorch's ``torch._dynamo.config.disable``, which
``TORCHDYNAMO_DISABLE=1`` sets; the environment variable ``KILN_COMPILE_DISABLE=1`` sets this at import)."""

accumulated_cache_size_limit: int = 256
"""How many traces one compiled function keeps in all, the other shapes of a kept trace included (which
``cache_size_limit`` does not count: see ``automatic_dynamic_shapes``); PyTorch's default is 256 as well."""

automatic_dynamic_shapes: bool = True
"""True: a compiled function with ``dynamic=None`` (the default) that meets a kept trace's program at other
shapes (the same ops on tensors of the same ranks; only sizes, strides and the int arguments of ops
differ) traces it again without counting it towards ``cache_size_limit``, and compiles it with kernels
that read the sizes that changed at run time, which its later shapes reuse (PyTorch's setting of the same
name). False: every new shape counts, and each trace's kernels are made for its shapes, as with
``dynamic=False``."""

suppress_errors: bool = False
"""True: a call whose trace the backend fails to compile runs eagerly, with a warning naming the error,
and so do that trace's later calls (PyTorch's setting of the same name; not under ``fullgraph=True``);
False: the call raises :class:`kiln.compile.BackendCompilerFailed`."""

_OPTIONS = frozenset(__annotations__)  # the settings above

ALIASES = {
    "recompile_limit": "cache_size_limit",
    "accumulated_recompile_limit": "accumulated_cache_size_limit",
    "disable": "disabled",
}
"""PyTorch's names of these settings (``torch._dynamo.config.recompile_limit``...): reads and writes of them go
to the setting they name."""


def _resolve(name: str) -> str:
    """The setting ``name`` (or its alias) denotes; ``AttributeError`` for one that does not exist."""
    target = ALIASES.get(name, name)
    if target not in _OPTIONS:
        raise AttributeError(f"kiln.compile.config.{name} does not exist")
    return target


class _Patch(contextlib.ContextDecorator):
    """The settings ``changes`` for a block or a decorated function; the old values after it."""

    def __init__(self, changes: dict[str, Any]):
        self.changes = {_resolve(k): v for k, v in changes.items()}
        self.saved: list[dict[str, Any]] = []

    def __enter__(self):
        module = sys.modules[__name__]
        self.saved.append({k: getattr(module, k) for k in self.changes})
        for k, v in self.changes.items():
            setattr(module, k, v)
        return self

    def __exit__(self, *exc) -> None:
        module = sys.modules[__name__]
        for k, v in self.saved.pop().items():
            setattr(module, k, v)


def patch(arg1: str | dict | None = None, arg2: Any = None, **kwargs: Any) -> _Patch:
    """Settings for a block, as a context manager or a decorator (``torch._dynamo.config.patch``):
    ``patch("suppress_errors", True)``, ``patch({"suppress_errors": True})`` or
    ``patch(suppress_errors=True)``; an unknown name raises ``AttributeError``."""
    if isinstance(arg1, str):
        changes = {arg1: arg2}
    elif isinstance(arg1, dict):
        changes = dict(arg1)
    elif arg1 is None:
        changes = {}
    else:
        raise TypeError(f"patch: expected a setting's name or a dict, got {type(arg1).__name__}")
    changes.update(kwargs)
    return _Patch(changes)


class _Settings(types.ModuleType):
    """This module, under PyTorch's names too (:data:`ALIASES`); setting a name that is no setting raises
    ``AttributeError``, as ``torch._dynamo.config`` does."""

    def __getattr__(self, name: str) -> Any:  # only names the module does not hold: aliases
        if name in ALIASES:
            return getattr(self, ALIASES[name])
        raise AttributeError(f"kiln.compile.config.{name} does not exist")

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_"):  # (the import system's own attributes pass)
            name = _resolve(name)
        super().__setattr__(name, value)

    def __dir__(self) -> list[str]:
        return sorted(_OPTIONS | set(ALIASES) | {"patch"})


sys.modules[__name__].__class__ = _Settings

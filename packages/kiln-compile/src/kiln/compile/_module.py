"""``OptimizedModule``: what ``kiln.compile(module)`` returns (PyTorch's ``torch._dynamo.eval_frame.OptimizedModule``)."""

from __future__ import annotations

from collections.abc import Callable

import kiln.nn as nn
from kiln.compile._runtime import CompiledFunction

__all__ = ["OptimizedModule"]


class OptimizedModule(nn.Module):
    """A module whose calls run compiled: it wraps the original as ``_orig_mod`` (so its state dict's keys
    start with ``_orig_mod.``, as PyTorch's do) and reads any other attribute from it."""

    def __init__(
        self,
        mod: nn.Module,
        *,
        backend=None,
        fullgraph: bool = False,
        options: dict | None = None,
        dynamic: bool | None = None,
        call: Callable | None = None,
    ) -> None:
        super().__init__()
        self._orig_mod = mod
        if call is not None:  # calls it some other way (kiln.compile.disable's: eagerly, marked)
            self._compiled: Callable = call
            return
        self._compiled = CompiledFunction(
            mod._call_impl, backend=backend, fullgraph=fullgraph, options=options, dynamic=dynamic
        )
        from kiln.compile import _compiled

        _compiled.add(self._compiled)

    def forward(self, *args, **kwargs):
        """Call the original module through the compiled function (hooks of ``_orig_mod`` included)."""
        return self._compiled(*args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_orig_mod"], name)

"""``kiln._dynamo``: the names of ``torch._dynamo`` that training scripts use, so they run unchanged.

``config`` is ``kiln.compile.config``, which takes ``torch._dynamo.config``'s names as well
(``recompile_limit`` is ``cache_size_limit``, ``accumulated_recompile_limit`` is
``accumulated_cache_size_limit``, ``disable`` is ``disabled``; an option kiln does not have raises
``AttributeError``, as PyTorch's does; ``config.patch`` sets options for a block). :func:`reset`,
:func:`disable`, :func:`explain`, :func:`is_compiling`, :func:`list_backends` and :func:`allow_in_graph` are
kiln.compile's (``kiln.compiler``'s); ``exc`` holds ``Unsupported`` (kiln.compile's ``GraphBreakError``) and
``BackendCompilerFailed``. :func:`mark_dynamic`, :func:`maybe_mark_dynamic` and :func:`mark_static` mark a
tensor's dims for the compiler, and :func:`set_stance` is ``kiln.compiler.set_stance``.
"""

from __future__ import annotations

import sys

from kiln._dynamo import exc
from kiln.backend import mark_dynamic, mark_static, maybe_mark_dynamic  # (the core's: kiln.compile fills their hooks)
from kiln.compile import config, disable, explain, is_compiling, list_backends, reset
from kiln.compiler import allow_in_graph, set_stance

__all__ = [
    "allow_in_graph",
    "config",
    "disable",
    "exc",
    "explain",
    "is_compiling",
    "list_backends",
    "mark_dynamic",
    "mark_static",
    "maybe_mark_dynamic",
    "reset",
    "set_stance",
]

sys.modules[f"{__name__}.config"] = config  # import kiln._dynamo.config, as torch._dynamo.config

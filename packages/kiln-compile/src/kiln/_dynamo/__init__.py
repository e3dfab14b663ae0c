"""``kiln._dynamo``: the names of ``torch._dynamo`` that training scripts use, so they run unchanged.

``config`` is ``kiln.compile.config``, which takes ``torch._dynamo.config``'s names as well
(``recompile_limit`` is ``cache_size_limit``, ``accumulated_recompile_limit`` is
``accumulated_cache_size_limit``, ``disable`` is ``disabled``; an option kiln does not have raises
``AttributeError``, as PyTorch's does; ``config.patch`` sets options for a block). :func:`reset`,
:func:`disable`, :func:`explain`, :func:`is_compiling`, :func:`list_backends` and :func:`allow_in_graph` are
kiln.compile's (``kiln.compiler``'s); ``exc`` holds ``Unsupported`` (kiln.compile's ``GraphBreakError``) and
``BackendCompilerFailed``.
"""

from __future__ import annotations

import sys

from kiln._dynamo import exc
from kiln.compile import config, disable, explain, is_compiling, list_backends, reset
from kiln.compiler import allow_in_graph

__all__ = ["allow_in_graph", "config", "disable", "exc", "explain", "is_compiling", "list_backends", "reset"]

sys.modules[f"{__name__}.config"] = config  # import kiln._dynamo.config, as torch._dynamo.config

"""``kiln.compiler``: ``torch.compiler``'s names, so code written against PyTorch's compiler API runs.

:func:`compile` is ``kiln.compile``; :func:`reset`, :func:`disable`, :func:`is_compiling` and
:func:`list_backends` are kiln.compile's own. :func:`is_dynamo_compiling` is :func:`is_compiling` (kiln has
one tracer). :func:`allow_in_graph` returns its function: kiln's tracer records the ops of every Python
function a compiled function calls, so each one is in the graph already. :func:`set_stance` sets what every
compiled function does on its next calls (run eagerly, fail or run eagerly where it would compile anew).
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.compile import compile, disable, is_compiling, list_backends, reset
from kiln.compile._stance import set_stance

__all__ = [
    "allow_in_graph",
    "compile",
    "disable",
    "is_compiling",
    "is_dynamo_compiling",
    "list_backends",
    "reset",
    "set_stance",
]


def is_dynamo_compiling() -> bool:
    """Whether a kiln.compile trace is recording on this thread (``torch.compiler.is_dynamo_compiling``:
    :func:`is_compiling`, as kiln has one tracer)."""
    return is_compiling()


def allow_in_graph(fn: Callable | list | tuple) -> Callable | list:
    """``fn`` itself (``torch.compiler.allow_in_graph``): kiln's tracer records the ops of any function a
    compiled function calls, so ``fn``'s are in the graph without a mark. A list or tuple of functions gives
    the list of them; anything not callable raises PyTorch's ``AssertionError``."""
    if isinstance(fn, (list, tuple)):
        return [allow_in_graph(f) for f in fn]
    if not callable(fn):
        raise AssertionError("allow_in_graph expects a callable")
    return fn

"""Names that lead pickle back to kiln's functions.

Pickle stores a function by reference, as its ``__module__`` and ``__qualname__``, and finds it again by
importing that module and reading that attribute path. The op factories (``_unary``, the in-place method
variants) make functions in their own module that other modules bind (``kiln.erf``, ``kiln.special.erf``,
``Tensor.abs_``), so for about a fifth of kiln's functions those names led nowhere and ``pickle.dumps``
raised (``torch.erf`` pickles; so does a module that keeps ``self.act = torch.erf``).
:func:`name_bound_functions` makes those names lead back: mostly by binding the function where its names
say it lives.
"""

from __future__ import annotations

import builtins
import sys
from types import FunctionType, ModuleType

__all__ = ["name_bound_functions"]


def _found(fn: FunctionType) -> bool:
    """Whether ``fn``'s ``__module__`` and ``__qualname__`` lead back to ``fn`` (read through the modules'
    and classes' own dicts: a module's ``__getattr__`` may import)."""
    obj = sys.modules.get(fn.__module__)
    for part in fn.__qualname__.split("."):
        obj = getattr(obj, "__dict__", {}).get(part)
    return obj is fn


def name_bound_functions(namespace: ModuleType | type) -> None:
    """Make every function bound in ``namespace`` (a module, or a class's methods) findable by its names.

    Where its own module has nothing under its ``__qualname__`` (and Python no builtin of that name), it is
    bound there: its names stay as they are, and with them the module the docs file it under and the name
    Python's argument errors print. A method the class's own module made, or one whose name is taken there,
    takes the qualified name of its binding in the class instead (``Tensor.float``, as a method written in
    the class has), and another function the names of this binding (a wrapper such as
    ``kiln.linalg.solve``'s ``out=`` one, which copied the names of the function it wraps). A function's own
    name is preferred over an alias (``acos`` over ``arccos``)."""
    is_class = isinstance(namespace, type)
    items = [(name, fn) for name, fn in vars(namespace).items() if type(fn) is FunctionType and name[:2] != "__"]
    items.sort(key=lambda item: item[0] != item[1].__name__)  # (stable: the own names first)
    for name, fn in items:
        if _found(fn):
            continue
        home = sys.modules.get(fn.__module__)
        qualname = fn.__qualname__
        free = (
            home is not None and "." not in qualname and qualname not in vars(home) and not hasattr(builtins, qualname)
        )
        if is_class and (not free or fn.__module__ == namespace.__module__):
            # found through its class (one the class's own module made is named as a method written in the class)
            fn.__qualname__ = f"{namespace.__qualname__}.{name}"
            if not _found(fn):
                fn.__module__ = namespace.__module__
        elif free:
            setattr(home, qualname, fn)
        else:
            fn.__module__ = namespace.__name__
            fn.__qualname__ = name

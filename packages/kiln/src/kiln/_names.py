"""Names that lead pickle back to kiln's functions.

Pickle stores a function by reference, as its ``__module__`` and ``__qualname__``, and finds it again by
importing that module and reading that attribute path. The op factories (``_unary``, the in-place method
variants) make functions in their own module that other modules bind (``kiln.erf``, ``kiln.special.erf``,
``Tensor.abs_``), so for about a fifth of kiln's functions those names led nowhere and ``pickle.dumps``
raised (``torch.erf`` pickles; so does a module that keeps ``self.act = torch.erf``).
:func:`name_bound_functions` gives each such function the names of a binding that leads back to it.
"""

from __future__ import annotations

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


def name_bound_functions(namespace: ModuleType | type, methods: ModuleType | None = None) -> None:
    """Give every function bound in ``namespace`` whose names lead elsewhere the names of that binding: the
    module's name and the binding's name, or for a class (``methods`` given), the name of ``methods``, a module
    where the function is bound under its ``__qualname__`` too (a method's ``__qualname__`` is what Python's
    own argument errors name, so it stays ``abs_``, as PyTorch's messages say). A function's own name is
    preferred over an alias (``acos`` over ``arccos``)."""
    items = [(name, fn) for name, fn in vars(namespace).items() if type(fn) is FunctionType and name[:2] != "__"]
    items.sort(key=lambda item: item[0] != item[1].__name__)  # (stable: the own names first)
    for name, fn in items:
        if _found(fn):
            continue
        if methods is None:
            fn.__module__ = namespace.__name__
            fn.__qualname__ = name
            continue
        held = vars(methods).get(fn.__qualname__)
        if held is not None and held is not fn:  # that name is another method's: this one's own
            fn.__qualname__ = name
        setattr(methods, fn.__qualname__, fn)
        fn.__module__ = methods.__name__

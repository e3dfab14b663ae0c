"""``kiln.jit``: TorchScript's names, so model code written for ``torch.jit`` runs eagerly in kiln.

The decorators and queries that model code calls at definition or run time work as they do in eager
PyTorch: :func:`ignore`, :func:`unused`, :func:`export`, :func:`interface`, :func:`script_if_tracing`
return what they decorate; :func:`is_scripting` and :func:`is_tracing` are False; :func:`annotate`
returns its value; :func:`fork` runs the function and :func:`wait` returns its result, as eager
PyTorch does; ``Final`` is ``typing.Final``. :func:`save` and :func:`load` write and read exported programs
(``kiln.export``, from kiln-compile), which load and run with the core alone. Compiling (:func:`script`,
:func:`trace`) is the job of kiln-compile: these names call ``kiln.compile``'s functions of the same name when
that package is installed and otherwise raise ``ModuleNotFoundError`` naming it.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any

from kiln.futures import Future  # torch.jit.Future is torch.futures.Future (documented there)

__all__ = [
    "Attribute",
    "annotate",
    "export",
    "fork",
    "freeze",
    "ignore",
    "interface",
    "is_scripting",
    "is_tracing",
    "isinstance",
    "load",
    "optimize_for_inference",
    "save",
    "script",
    "script_if_tracing",
    "trace",
    "trace_module",
    "unused",
    "wait",
]

Final = typing.Final  # ``kiln.jit.Final[int]`` marks a constant attribute (typing's own object, so not in __all__)

_builtin_isinstance = isinstance


def is_scripting() -> bool:
    """False: kiln code always runs eagerly (model code uses this to skip eager-only branches)."""
    return False


def is_tracing() -> bool:
    """False: no kiln tracer is recording (kiln-compile's tracer sets its own state)."""
    return False


def ignore(drop: Any = False, **kwargs: Any) -> Any:
    """Leave a function to Python (``@kiln.jit.ignore`` or ``@kiln.jit.ignore(drop=True)``): eagerly it is
    the function itself."""
    if callable(drop):
        return drop
    return lambda fn: fn


def unused(fn: Callable) -> Callable:
    """Mark a function the compiler should replace with an exception: eagerly, the function itself."""
    return fn


def export(fn: Callable) -> Callable:
    """Mark a method as a compilation entry point: eagerly, the method itself."""
    return fn


def interface(obj: Any) -> Any:
    """Declare a TorchScript interface type: eagerly, the class itself."""
    return obj


def script_if_tracing(fn: Callable) -> Callable:
    """Compile ``fn`` only when called under a tracer: eagerly, the function itself."""
    return fn


def annotate(the_type: Any, the_value: Any) -> Any:
    """Give the compiler ``the_value``'s type: eagerly, ``the_value``."""
    return the_value


def Attribute(value: Any, type: Any) -> Any:
    """Declare a module attribute's type for the compiler: eagerly, ``value``."""
    return value


def isinstance(obj: Any, target_type: Any) -> bool:  # noqa: A001 (PyTorch's name)
    """``isinstance`` that understands parameterised container types (``list[int]``,
    ``dict[str, Tensor]``, ``Optional[Tensor]``, ``tuple[int, int]``), checking the elements."""
    if _builtin_isinstance(target_type, tuple):  # isinstance(x, (list[int], str)): any of them
        return any(isinstance(obj, t) for t in target_type)
    origin = typing.get_origin(target_type)
    if origin is None:
        if target_type in (list, dict, tuple):
            raise RuntimeError(
                f"Attempted to use {target_type.__name__} without a contained type. Please add a contained type, "
                f"e.g. {target_type.__name__}[int]"
            )
        return target_type is Any or _builtin_isinstance(obj, target_type)
    args = typing.get_args(target_type)
    if not args and origin in (list, dict, tuple):  # typing.List, typing.Dict: no contained type
        raise RuntimeError(
            f"Attempted to use {origin.__name__} without a contained type. Please add a contained type, "
            f"e.g. {origin.__name__}[int]"
        )
    if origin is typing.Union or origin is types.UnionType:
        return any(isinstance(obj, a) if a is not type(None) else obj is None for a in args)
    if not _builtin_isinstance(obj, origin):
        return False
    if origin is list:
        return all(isinstance(x, args[0]) for x in obj)
    if origin is dict:
        return all(isinstance(k, args[0]) and isinstance(v, args[1]) for k, v in obj.items())
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return all(isinstance(x, args[0]) for x in obj)
        return len(obj) == len(args) and all(isinstance(x, a) for x, a in zip(obj, args, strict=True))
    return True


def fork(func: Callable, *args: Any, **kwargs: Any) -> Future:
    """Run ``func(*args, **kwargs)`` and return a completed :class:`~kiln.futures.Future` holding its result
    (eager PyTorch runs the forked function at once, and so does kiln)."""
    future = Future()
    future.set_result(func(*args, **kwargs))
    return future


def wait(future: Future) -> Any:
    """The result of a :func:`fork`."""
    return future.wait()


def _compiler(name: str) -> Callable:
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            import kiln.compile as compiler
        except ModuleNotFoundError as exc:
            if exc.name not in ("kiln.compile", "kiln"):
                raise
            raise ModuleNotFoundError(
                f"kiln.jit.{name} compiles the program, which needs the kiln-compile package: pip install kiln-compile",
                name="kiln.compile",
            ) from None
        return getattr(compiler, name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``kiln.compile.{name}`` (from the kiln-compile package), under TorchScript's name."
    return call


script = _compiler("script")
trace = _compiler("trace")
trace_module = _compiler("trace_module")
freeze = _compiler("freeze")
optimize_for_inference = _compiler("optimize_for_inference")


def save(m: Any, f: Any, _extra_files: Any = None) -> None:
    """Save an exported program (``kiln.export.export(model, args)``, kiln-compile) to ``f``: safetensors plus the
    program as JSON (``torch.jit.save`` saves a scripted module; kiln's compiled form is the exported program)."""
    from kiln._program import save_program

    if _extra_files:
        raise NotImplementedError("kiln.jit.save: _extra_files is not supported")
    save_program(m, f)


def load(f: Any, map_location: Any = None, _extra_files: Any = None) -> Any:
    """Load a program :func:`save` (or ``kiln.export.save``) wrote and return it, callable as the model was:
    with the core alone, without the model's Python code, and executing nothing from the file."""
    from kiln._program import load_program

    if _extra_files:
        raise NotImplementedError("kiln.jit.load: _extra_files is not supported")
    if map_location not in (None, "cpu") and str(map_location) != "cpu":
        raise NotImplementedError("kiln.jit.load: programs load on the cpu (move the inputs' results afterwards)")
    return load_program(f)

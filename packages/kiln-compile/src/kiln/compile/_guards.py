"""Guards: what must hold for a trace to be reused, checked on every call by one generated function.

A trace depends on more than its tensors' values: on the structure of the arguments and every Python value
among them, each tensor's shape, strides, dtype, device and ``requires_grad``, the grad mode, the default
dtype and autocast, the Python numbers the function reads from its globals and closure, and the state of
the modules and optimizers it can reach (each submodule's ``training`` flag, its plain attributes, the
identity of its parameters and buffers; each optimizer's hyperparameters and state tensors). The guard
function checks all of that and returns the flat list of the graph's input tensors, or ``None`` when
anything differs (the caller then traces again). ``describe()`` lists the guards in words for
``kiln.compile.explain``.
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable
from typing import Any

import kiln

__all__ = ["GuardBuilder", "flatten"]

_SCALARS = (int, float, bool, str, type(None), complex)


def flatten(obj: Any, out: list) -> None:
    """The leaves of ``obj`` (tuples, lists and dicts followed) appended to ``out``, in order."""
    if type(obj) in (tuple, list):
        for x in obj:
            flatten(x, out)
    elif type(obj) is dict:
        for x in obj.values():
            flatten(x, out)
    else:
        out.append(obj)


def _plain(v: Any) -> bool:
    """A value a guard compares by value: a Python scalar, a dtype, a device, or a tuple of them."""
    if isinstance(v, (*_SCALARS, kiln.dtype, kiln.device)):
        return True
    return type(v) is tuple and all(_plain(x) for x in v)


def module_class():
    nn = sys.modules.get("kiln.nn")
    return getattr(nn, "Module", None)


def _optimizer_class():
    optim = sys.modules.get("kiln.optim")
    return getattr(optim, "Optimizer", None)


_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def module_state(module) -> tuple:
    """What a trace of ``module`` depends on besides its tensors' values: per submodule, its class, training
    flag, plain attributes, the identity of its parameters and buffers, and its hooks."""
    out = []
    for sub in module.modules():
        d = sub.__dict__
        attrs = tuple((k, v) for k, v in d.items() if _plain(v))  # private ones too (self._scale)
        params = tuple(id(p) for p in d.get("_parameters", {}).values())
        buffers = tuple(id(b) for b in d.get("_buffers", {}).values())
        hooks = tuple(tuple(d.get(h, ())) for h in _HOOKS)
        out.append((type(sub), sub.training, attrs, params, buffers, hooks))
    return tuple(out)


def optimizer_state(opt) -> tuple:
    """An optimizer's hyperparameters (every plain value of every group) and the identity of its state."""
    groups = tuple(tuple((k, v) for k, v in g.items() if k != "params" and _plain(v)) for g in opt.param_groups)
    state = tuple((id(p), tuple((k, id(v)) for k, v in s.items())) for p, s in opt.state.items())
    return (groups, state)


def reachable_objects(fn: Callable, leaves: list) -> tuple[list, list[tuple[dict, str, Any]], list]:
    """The modules and optimizers ``fn`` can reach (arguments, its ``self``, its defaults, a partial's bound
    arguments, the globals its code names, its closure), and the plain globals and closure values its code
    reads: ``(objects, globals, cells)``."""
    module_cls, opt_cls = module_class(), _optimizer_class()
    kinds = tuple(c for c in (module_cls, opt_cls) if c is not None)
    objects = [x for x in leaves if kinds and isinstance(x, kinds)]
    while isinstance(fn, functools.partial):  # a partial's bound arguments are reachable too
        objects += [x for x in (*fn.args, *fn.keywords.values()) if kinds and isinstance(x, kinds)]
        fn = fn.func
    func = getattr(fn, "__func__", fn)
    owner = getattr(fn, "__self__", None)
    if owner is not None and kinds and isinstance(owner, kinds):
        objects.append(owner)
    defaults = (*(getattr(func, "__defaults__", None) or ()), *(getattr(func, "__kwdefaults__", None) or {}).values())
    objects += [x for x in defaults if kinds and isinstance(x, kinds)]
    globals_read: list[tuple[dict, str, Any]] = []
    cells = []
    funcs = [func]
    if module_cls is not None and isinstance(owner, module_cls):  # a module's call: its forward's code too
        funcs.append(getattr(type(owner).forward, "__func__", type(owner).forward))
    for f in funcs:
        code = getattr(f, "__code__", None)
        if code is None:
            continue
        g = getattr(f, "__globals__", {})
        for name in sorted(_names(code)):
            if name in g:
                v = g[name]
                if _plain(v):
                    globals_read.append((g, name, v))
                elif kinds and isinstance(v, kinds):
                    objects.append(v)
        for cell in getattr(f, "__closure__", None) or ():
            try:
                v = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if _plain(v):
                cells.append((cell, v))
            elif kinds and isinstance(v, kinds):
                objects.append(v)
    unique = {id(o): o for o in objects}
    return list(unique.values()), globals_read, cells


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _names(c)
    return names


class GuardBuilder:
    """Collects the guards of one trace and generates their check."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.conditions: list[str] = []
        self.words: list[str] = []
        self.consts: dict[str, Any] = {}

    def const(self, value: Any) -> str:
        """A name the generated code reads ``value`` by."""
        name = f"c{len(self.consts)}"
        self.consts[name] = value
        return name

    def check(self, condition: str, words: str) -> None:
        """Add ``condition`` (a Python expression over ``args`` and ``kwargs``) as a guard, described by ``words``."""
        self.lines.append(f"    if not ({condition}): return None")
        self.conditions.append(condition)
        self.words.append(words)

    def structure(self, obj: Any, path: str, tensors: list[str]) -> None:
        """Guards on the arguments at ``path``: containers' types, lengths and keys; every leaf by its kind.
        ``tensors`` collects the expressions of the tensor leaves, in :func:`flatten`'s order."""
        t = type(obj)
        if t in (tuple, list):
            self.check(
                f"type({path}) is {self.const(t)} and len({path}) == {len(obj)}",
                f"{path} is a {t.__name__} of {len(obj)}",
            )
            for i, x in enumerate(obj):
                self.structure(x, f"{path}[{i}]", tensors)
        elif t is dict:
            keys = tuple(obj)
            self.check(f"type({path}) is dict and tuple({path}) == {self.const(keys)}", f"{path} has keys {keys}")
            for k, x in obj.items():
                self.structure(x, f"{path}[{self.const(k)}]", tensors)
        elif isinstance(obj, kiln.Tensor):
            self.tensor(obj, path, path)
            tensors.append(path)
        elif obj is None:
            self.check(f"{path} is None", f"{path} is None")
        elif _plain(obj):
            self.check(f"type({path}) is {self.const(t)} and {path} == {self.const(obj)}", f"{path} == {obj!r}")
        else:
            self.check(f"{path} is {self.const(obj)}", f"{path} is the same {t.__name__} object")

    def tensor(self, t: kiln.Tensor, expr: str, label: str) -> None:
        """Guards on one tensor's class, dtype, device, shape, strides, offset and ``requires_grad``."""
        meta = (type(t), t.dtype, t.device, tuple(t.shape), t.stride(), t.storage_offset(), t.requires_grad)
        self.check(f"_meta({expr}) == {self.const(meta)}", f"{label}: {_describe_meta(meta)}")

    def object_state(self, obj: Any) -> None:
        """Guards on a module's or an optimizer's state (see :func:`module_state`)."""
        module_cls = module_class()
        if module_cls is not None and isinstance(obj, module_cls):
            fn, what = (
                module_state,
                f"the state of module {type(obj).__name__} (training flags, attributes, parameters)",
            )
        else:
            fn, what = optimizer_state, f"the hyperparameters and state of optimizer {type(obj).__name__}"
        self.check(f"{self.const(fn)}({self.const(obj)}) == {self.const(fn(obj))}", what)

    def build(self, tensors: list[str]) -> Callable:
        """The guard function ``(args, kwargs) -> list of input tensors | None``."""
        body = "\n".join(self.lines) or "    pass"
        src = f"def guard(args, kwargs):\n{body}\n    return [{', '.join(tensors)}]\n"
        ns = dict(self.consts)
        ns["_meta"] = _meta
        exec(compile(src, "<kiln.compile guards>", "exec"), ns)  # noqa: S102 - our own generated source
        fn = ns["guard"]
        fn.source = src
        checks = [eval(f"lambda args, kwargs: {c}", ns) for c in self.conditions]
        fn.failures = lambda args, kwargs: [w for w, c in zip(self.words, checks) if not _holds(c, args, kwargs)]
        return fn


def _holds(check: Callable, args, kwargs) -> bool:
    try:
        return bool(check(args, kwargs))
    except Exception:  # noqa: BLE001 - an earlier guard (a structure one) fails too, and is the one reported
        return False


def _meta(t: kiln.Tensor) -> tuple:
    return (type(t), t.dtype, t.device, t.shape, t.stride(), t.storage_offset(), t.requires_grad)


def _describe_meta(meta: tuple) -> str:
    cls, dtype, device, shape, stride, offset, rg = meta
    return f"{cls.__name__} {dtype} on {device}, shape {list(shape)}, strides {stride}, offset {offset}, requires_grad={rg}"


def global_state() -> tuple:
    """The global settings a trace depends on: grad and inference mode, the default dtype, autocast."""
    autocast = tuple((dev, kiln.is_autocast_enabled(dev), kiln.get_autocast_dtype(dev)) for dev in ("cpu", "cuda"))
    return (kiln.is_grad_enabled(), kiln.is_inference_mode_enabled(), kiln.get_default_dtype(), autocast)
